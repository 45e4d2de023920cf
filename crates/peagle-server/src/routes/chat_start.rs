//! A chat started: the request checked, its conversation rendered and tokenized, its choices
//! submitted to the engine, and how each choice's answer is to be split into reasoning,
//! content and calls. `/v1/chat/completions` and `/v1/responses` start chats alike and differ
//! in how they write the answer.

use super::chat_prompt::{answer_role, echoed, prompt_ids};
use super::{check_model, constrain};
use crate::answer::{AnswerParser, CallParser, Offer};
use crate::choice::Choice;
use crate::error::ApiError;
use crate::forced_calls::{forced_schema, ForcedCalls};
use crate::harmony;
use crate::hermes::Hermes;
use crate::llama3_json::Llama3Json;
use crate::params::{check_prompt, check_prompt_logprobs, check_sequences, logprobs_count, ChoiceTemplate};
use crate::protocol::chat::{ChatRender, ChatRequest};
use crate::protocol::sampling::SamplingRequest;
use crate::protocol::structured::Asked;
use crate::protocol::tools::ToolChoice;
use crate::served_model::{ServedModel, ToolCallParser};
use crate::state::AppState;
use crate::thinking::{PromptThinking, Thinking};
use peagle_grammar::Spec;
use std::sync::Arc;
use std::time::Instant;

/// What a route adds to a chat request: the fields its refusals name, and structured output
/// it asks for in fields of its own.
pub struct ChatFields {
    /// The conversation's field: `messages`, or `input`.
    pub prompt: &'static str,
    /// The answer's length limit and its field's name.
    pub max_tokens: (Option<i64>, &'static str),
    /// What the answer's text is held to, besides the sampling fields' structured output.
    pub held: Option<Asked>,
}

/// A chat's choices, running, with what writing their answers needs.
pub struct StartedChat {
    pub choices: Vec<Choice>,
    /// The answer's role ("assistant" for a new turn).
    pub role: String,
    /// What the answer starts with (`echo`).
    pub echo: String,
    pub prompt_tokens: usize,
    /// Logprobs' alternatives a token, when asked for.
    pub logprobs: Option<usize>,
    /// Whether the prompt's tokens are scored (`prompt_logprobs`).
    pub prompt_logprobs: bool,
    setup: AnswerSetup,
}

impl StartedChat {
    /// A new parser for one choice's answer.
    pub fn parser(&self, model: &ServedModel) -> AnswerParser {
        answer_parser(model, &self.setup)
    }
}

/// Checks `req`, renders and tokenizes its conversation, and submits its choices; `arrived`
/// is when the HTTP request came in (TTFT).
pub async fn start_chat(
    state: &Arc<AppState>,
    req: &ChatRequest,
    sampling: SamplingRequest,
    fields: ChatFields,
    arrived: Instant,
) -> Result<StartedChat, ApiError> {
    check_model(state, req.model.as_deref())?;
    if req.chat_template.as_ref().is_some_and(|t| !t.is_null()) {
        return Err(ApiError::invalid(
            Some("chat_template"),
            "chat_template: a template sent with the request is not supported; the model's is used",
        ));
    }
    let streaming = req.stream.unwrap_or(false);
    let mut template = sampling.check(&state.model.sampling_defaults, |w| state.model.encode_words(w))?;
    check_sequences(1, template.n, state.config.max_sequences_per_request)?;
    check_prompt_logprobs(&template, streaming)?;
    let top = req
        .top_logprobs
        .map(|v| logprobs_count(v, "top_logprobs"))
        .transpose()?;
    let logprobs = match (req.logprobs.unwrap_or(false), top) {
        (true, top) => Some(top.unwrap_or(0)),
        (false, None) => None,
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                Some("top_logprobs"),
                "top_logprobs needs logprobs set to true",
            ))
        }
    };
    let render = ChatRender::new(
        req.add_generation_prompt,
        req.continue_final_message,
        req.chat_template_kwargs.as_ref(),
        req.reasoning_effort.as_deref(),
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
    )?;
    let harmony = state.model.harmony.clone();
    if harmony.is_some() && req.echo.unwrap_or(false) {
        return Err(ApiError::invalid(
            Some("echo"),
            "echo is not supported for harmony (gpt-oss) chats",
        ));
    }
    let role = answer_role(&req.messages, &render);
    let tools = render.tools.iter().map(|t| t.name.clone()).collect();
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    let offer = Offer::new(tools, parallel);
    let forced = match &harmony {
        Some(harmony) => harmony.forced_call(&render.tool_choice, &render.tools),
        None => forced_schema(&render.tool_choice, &render.tools, parallel).map(|schema| Spec::JsonSchema {
            schema,
            whitespace: None,
        }),
    };
    let tool_choice = render.tool_choice.clone();
    let max_len = state.engine.max_model_len();
    let limit = template.tokens_before_truncation(max_len);
    let (prompt, thinking) = prompt_ids(
        state,
        req.messages.clone(),
        render,
        req.add_special_tokens,
        limit,
        fields.prompt,
    )
    .await?;
    let prompt = template.truncate(prompt, max_len)?;
    let echo = match req.echo.unwrap_or(false) {
        true => echoed(&req.messages, &role)?,
        false => String::new(),
    };
    check_prompt(prompt.len(), max_len, fields.prompt)?;
    let (requested, param) = fields.max_tokens;
    // Without a limit, a chat answer may use the rest of the context.
    let budget = template.budget(requested, param, usize::MAX, prompt.len(), max_len)?;
    if let Some(asked) = fields.held {
        let because = format!("{} asks for it", asked.param);
        hold(&mut template, asked, &because)?;
    }
    // A harmony call's structure holds the answer from its first token, its analysis
    // included; other structured output waits for the answer after the reasoning.
    let trigger = match (&harmony, &forced) {
        (Some(_), Some(_)) => Vec::new(),
        _ => answer_trigger(&state.model, thinking)?,
    };
    if let Some(spec) = forced {
        let calls = Asked { spec, param: "tools" };
        hold(&mut template, calls, "tool_choice forces a call")?;
    }
    if let Some(harmony) = &harmony {
        template.speak_harmony(harmony);
    }
    constrain(state, &mut template, trigger).await?;
    let setup = AnswerSetup {
        offer,
        thinking,
        tool_choice,
    };
    // A Hermes model's call markers may be special tokens, which the text would leave out
    // (vLLM's parser keeps them likewise).
    if state.model.tool_call_parser == Some(ToolCallParser::Hermes) && !setup.offer.is_empty() {
        template.text.skip_special = false;
    }
    let requests = (0..template.n)
        .map(|i| template.request(&prompt, budget, logprobs, i))
        .collect();
    let choices = Choice::start_all(state, requests, &template.text, arrived)?;
    Ok(StartedChat {
        choices,
        role,
        echo,
        prompt_tokens: prompt.len(),
        logprobs,
        prompt_logprobs: template.text.prompt_logprobs.is_some(),
        setup,
    })
}

/// Where a chat's structured output starts: after the reasoning, as vLLM's reasoning parsers
/// have it. A harmony answer's final message follows its analysis (`<|channel|>final<|message|>`
/// opens it); with a reasoning parser, a template model's answer is constrained after
/// `</think>` unless the prompt closed the thinking (a hybrid model's thinking turned off).
/// Others are constrained from their first token.
pub(super) fn answer_trigger(model: &ServedModel, thinking: PromptThinking) -> Result<Vec<u32>, ApiError> {
    let opener = if model.harmony.is_some() {
        "<|channel|>final<|message|>"
    } else {
        match (model.reasoning_parser, thinking) {
            (Some(_), PromptThinking::Open | PromptThinking::Neither) => "</think>",
            _ => return Ok(Vec::new()),
        }
    };
    model.encode_words(opener)
}

/// Holds the answer to `asked` (a route's own field, or a forced call's); structured output
/// asked for besides is a 400 that says `because`.
fn hold(template: &mut ChoiceTemplate, asked: Asked, because: &str) -> Result<(), ApiError> {
    if let Some(already) = &template.structured {
        return Err(ApiError::invalid(
            Some(already.param),
            format!(
                "{}: structured output cannot be asked for when {because}",
                already.param
            ),
        ));
    }
    template.structured = Some(asked);
    Ok(())
}

/// What a request tells each of its choices' answer parsers.
pub(super) struct AnswerSetup {
    /// The function tools offered, and how many calls an answer may make.
    pub offer: Offer,
    /// Where the prompt leaves a template model's thinking.
    pub thinking: PromptThinking,
    /// Whether the answer must be calls (then read by `ForcedCalls`, with or without a parser).
    pub tool_choice: ToolChoice,
}

/// How a choice's answer is split: by harmony's channels, or by the parsers the server has
/// for its chat template's model; calls as the offer allows (none looked for where no tool
/// is offered).
pub(super) fn answer_parser(model: &ServedModel, setup: &AnswerSetup) -> AnswerParser {
    let offer = || setup.offer.clone();
    if model.harmony.is_some() {
        return AnswerParser::Harmony(harmony::Channels::offering(offer()));
    }
    let forced = ForcedCalls::new(&setup.tool_choice).map(CallParser::Forced);
    let calls = forced.or_else(|| match model.tool_call_parser.filter(|_| !setup.offer.is_empty()) {
        Some(ToolCallParser::Hermes) => Some(CallParser::Hermes(Hermes::offering(offer()))),
        Some(ToolCallParser::Llama3Json) => Some(CallParser::Llama3Json(Llama3Json::offering(offer()))),
        Some(ToolCallParser::Openai) | None => None,
    });
    AnswerParser::Template {
        thinking: model
            .reasoning_parser
            .map(|parser| Thinking::new(parser, setup.thinking)),
        calls,
    }
}

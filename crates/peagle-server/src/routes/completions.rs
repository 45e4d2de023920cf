//! `POST /v1/completions`: one or more prompts (text or token ids), n choices each, streamed
//! or not. Choice indices run prompt by prompt: prompt p's choice i is p * n + i.

use super::{check_model, constrain, off_runtime};
use crate::choice::{Choice, Finish};
use crate::error::ApiError;
use crate::json_body::ApiJsonViews;
use crate::openapi::{ApiErrors, StreamEvent};
use crate::params::{
    check_prompt, check_prompt_logprobs, check_sequences, check_token_ids, logprobs_count, ChoiceTemplate,
};
use crate::protocol::completion::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, PromptInput,
};
use crate::protocol::refused::asks_for;
use crate::protocol::sampling::SamplingRequest;
use crate::protocol::tools::ToolChoice;
use crate::protocol::TokenLogprob;
use crate::protocol::{response_id, unix_time, StreamUsage, Usage};
use crate::sse::{done_event, error_event, json_event, merged};
use crate::state::AppState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::try_join_all;
use futures_util::{Stream, StreamExt};
use peagle_engine::FinishReason;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

/// The body: the route's own fields and the sampling fields, read as two views.
type CompletionBody = ApiJsonViews<CompletionRequest, SamplingRequest>;

/// OpenAI's default for completions.
const DEFAULT_MAX_TOKENS: usize = 16;

struct Prompt {
    ids: Vec<u32>,
    /// What `echo` puts before the completion: the prompt as sent, or its token ids decoded.
    text: String,
}

/// What every chunk and the response repeat.
struct Meta {
    id: String,
    created: u64,
    model: String,
}

impl Meta {
    fn response(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn chunk(
        &self,
        index: usize,
        text: String,
        logprobs: Option<CompletionLogprobs>,
        finish: Option<&Finish>,
        usage: Option<Usage>,
    ) -> CompletionResponse {
        let choice = CompletionChoice {
            index,
            text,
            logprobs,
            finish_reason: finish.map(|f| f.reason.as_str()),
            stop_reason: finish.and_then(|f| f.stop_reason.clone()),
            prompt_logprobs: None,
        };
        self.response(vec![choice], usage)
    }
}

#[utoipa::path(post, path = "/v1/completions", tag = "OpenAI", security(("api_key" = [])),
    request_body = CompletionBody,
    responses(
        (status = 200, description = "The completion; with `stream`, server-sent events each holding a chunk of \
            the same shape, then `data: [DONE]`",
            content((CompletionResponse = "application/json"), (StreamEvent = "text/event-stream"))),
        ApiErrors,
    ))]
pub async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJsonViews(req, sampling): CompletionBody,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    check_model(&state, req.model.as_deref())?;
    let streaming = req.stream.unwrap_or(false);
    let usage = StreamUsage::of(streaming, req.stream_options.as_ref())?;
    let mut template = sampling.check(&state.model.sampling_defaults, |w| state.model.encode_words(w))?;
    check_unsupported(&req, template.n)?;
    check_sequences(req.prompt.count(), template.n, state.config.max_sequences_per_request)?;
    check_prompt_logprobs(&template, streaming)?;
    constrain(&state, &mut template, Vec::new()).await?;
    let logprobs = req.logprobs.map(|v| logprobs_count(v, "logprobs")).transpose()?;
    let echo = req.echo.unwrap_or(false);
    // Echo with logprobs scores the prompt too (the first token gets null), as in vLLM.
    template.text.echo_logprobs = logprobs.filter(|_| echo);
    // OpenAI's legacy scoring request: the prompt echoed (with its logprobs when asked for)
    // and nothing generated. The engine generates one token, which the response leaves out.
    let scoring = echo && req.max_tokens == Some(0);
    let max_tokens = if scoring { Some(1) } else { req.max_tokens };
    let input = req.prompt;
    let add_special_tokens = req.add_special_tokens.unwrap_or(true);
    let prompts = off_runtime({
        let (state, template) = (state.clone(), template.clone());
        move || prompts(&state, &input, add_special_tokens, &template)
    })
    .await?;
    // Check every prompt before submitting any, so a bad one leaves nothing running.
    let max_len = state.engine.max_model_len();
    let budgets = prompts
        .iter()
        .map(|p| {
            check_prompt(p.ids.len(), max_len, "prompt")?;
            template.budget(max_tokens, "max_tokens", DEFAULT_MAX_TOKENS, p.ids.len(), max_len)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let mut requests = Vec::new();
    let mut echoes = Vec::new();
    for (prompt, budget) in prompts.iter().zip(budgets) {
        for i in 0..template.n {
            requests.push(template.request(&prompt.ids, budget, logprobs, i));
            echoes.push(if echo { prompt.text.clone() } else { String::new() });
        }
    }
    let choices = Choice::start_all(&state, requests, &template.text, arrived)?;
    let meta = Meta {
        id: response_id("cmpl-", &headers),
        created: unix_time(),
        model: state.model.name.clone(),
    };
    // Each choice's prompt, for usage: prompt p's choices are p * n .. (p + 1) * n.
    let prompt_lens: Vec<usize> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.ids.len(), template.n))
        .collect();
    if streaming {
        let shape = StreamShape {
            n: template.n,
            scoring,
            usage,
        };
        return Ok(stream(meta, choices, echoes, prompt_lens, shape).into_response());
    }
    let prompt_tokens = prompts.iter().map(|p| p.ids.len()).sum();
    let mut outcomes = try_join_all(choices.into_iter().map(Choice::collect)).await?;
    if scoring {
        for (o, prompt_len) in outcomes.iter_mut().zip(&prompt_lens) {
            o.text.clear();
            o.logprobs.truncate(*prompt_len);
            scored(&mut o.finish);
        }
    }
    let completion_tokens = outcomes.iter().map(|o| o.finish.completion_tokens).sum();
    // A prompt's cached tokens count once, as its tokens do.
    let cached_tokens = outcomes
        .iter()
        .step_by(template.n)
        .map(|o| o.finish.cached_tokens)
        .sum();
    let choices = outcomes
        .into_iter()
        .zip(echoes)
        .enumerate()
        .map(|(index, (o, echo))| CompletionChoice {
            index,
            text: echo + &o.text,
            logprobs: logprobs.map(|_| CompletionLogprobs::new(&o.logprobs)),
            finish_reason: Some(o.finish.reason.as_str()),
            stop_reason: o.finish.stop_reason,
            prompt_logprobs: template.text.prompt_logprobs.map(|_| o.prompt_logprobs),
        })
        .collect();
    let usage = Usage::finished(prompt_tokens, completion_tokens, cached_tokens);
    Ok(Json(meta.response(choices, Some(usage))).into_response())
}

/// A scoring request's choice, whose one generated token the response leaves out: it ends at
/// its length, 0.
fn scored(finish: &mut Finish) {
    finish.reason = FinishReason::Length;
    finish.stop_reason = None;
    finish.completion_tokens = 0;
}

/// Legacy fields vLLM refuses too, rather than ignoring what the client asked for.
fn check_unsupported(req: &CompletionRequest, n: usize) -> Result<(), ApiError> {
    if req.best_of.is_some_and(|b| b != n as i64) {
        return Err(ApiError::invalid(
            Some("best_of"),
            "best_of is not supported; ask for n choices and pick among them",
        ));
    }
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid(Some("suffix"), "suffix is not supported"));
    }
    if ToolChoice::of(req.tool_choice.as_ref())?.forces() {
        return Err(ApiError::invalid(
            Some("tool_choice"),
            "tool_choice: calls are forced in /v1/chat/completions, which offers tools",
        ));
    }
    if asks_for(&req.tools) {
        return Err(ApiError::invalid(
            Some("tools"),
            "tools: tool calling is offered in /v1/chat/completions, not in completions",
        ));
    }
    Ok(())
}

/// The prompts' token ids, cut as `truncate_prompt_tokens` asks (an echo then gives the
/// tokens kept).
fn prompts(
    state: &AppState,
    input: &PromptInput,
    add_special_tokens: bool,
    template: &ChoiceTemplate,
) -> Result<Vec<Prompt>, ApiError> {
    let model = &state.model;
    let max_len = state.engine.max_model_len();
    // The echo is the text as sent where the prompt is kept whole, else its kept tokens'.
    let truncated = |ids: Vec<u32>, sent: Option<&String>| -> Result<Prompt, ApiError> {
        let len = ids.len();
        let ids = template.truncate(ids, max_len)?;
        let text = match sent {
            Some(text) if ids.len() == len => text.clone(),
            _ => model.decode(&ids)?,
        };
        Ok(Prompt { ids, text })
    };
    let from_text = |text: &String| -> Result<Prompt, ApiError> {
        // Judged on the text: a tokenizer that adds BOS would make "" one token long.
        if text.is_empty() {
            return Err(ApiError::invalid(Some("prompt"), "prompt is empty"));
        }
        let limit = template.tokens_before_truncation(max_len);
        let ids = model.encode(text, add_special_tokens, limit, "prompt")?;
        truncated(ids, Some(text))
    };
    let from_ids = |ids: &Vec<u32>| -> Result<Prompt, ApiError> {
        check_token_ids(ids, model.vocab_size(), "prompt")?;
        truncated(ids.clone(), None)
    };
    let prompts = match input {
        PromptInput::Text(text) => vec![from_text(text)?],
        PromptInput::Texts(texts) => texts.iter().map(from_text).collect::<Result<_, _>>()?,
        PromptInput::Tokens(ids) => vec![from_ids(ids)?],
        PromptInput::TokenLists(lists) => lists.iter().map(from_ids).collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid(Some("prompt"), "prompt is empty"));
    }
    Ok(prompts)
}

/// How a stream's chunks are made.
struct StreamShape {
    /// Choices a prompt has: its tokens count once in the usage, as vLLM counts them.
    n: usize,
    /// Only the echoed prompt is sent: the generated token's text and logprobs are not.
    scoring: bool,
    usage: StreamUsage,
}

/// Streams the choices; `prompt_lens[i]` is choice i's prompt length.
fn stream(
    meta: Meta,
    choices: Vec<Choice>,
    echoes: Vec<String>,
    prompt_lens: Vec<usize>,
    shape: StreamShape,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let StreamShape { n, scoring, usage } = shape;
    let with_logprobs = |tokens: &[TokenLogprob]| (!tokens.is_empty()).then(|| CompletionLogprobs::new(tokens));
    let prompt_tokens = prompt_lens.iter().step_by(n.max(1)).sum();
    let mut generated = vec![0; choices.len()];
    let mut cached = vec![0; choices.len()];
    // Each echo goes out with its choice's first update, which holds the prompt's logprobs
    // when they were asked for, as vLLM sends them.
    let mut echoes = echoes;
    let events = async_stream::stream! {
        let mut updates = merged(choices);
        let mut completion_tokens = 0;
        while let Some((index, update)) = updates.next().await {
            let update = match update {
                Ok(update) => update,
                Err(e) => {
                    yield error_event(&e);
                    break;
                }
            };
            let mut update = update;
            let mut finish = update.finish.take();
            if scoring {
                // The prompt's logprobs come in an update of no tokens; the rest is generated.
                if update.tokens > 0 {
                    update.logprobs.clear();
                }
                update.text.clear();
                update.tokens = 0;
                finish.iter_mut().for_each(scored);
            }
            let text = std::mem::take(&mut echoes[index]) + &update.text;
            if text.is_empty() && update.logprobs.is_empty() && finish.is_none() {
                continue;
            }
            completion_tokens += finish.as_ref().map_or(0, |f| f.completion_tokens);
            cached[index] = finish.as_ref().map_or(0, |f| f.cached_tokens);
            generated[index] += update.tokens;
            let so_far = usage.per_chunk.then(|| Usage::new(prompt_lens[index], generated[index]));
            yield json_event(&meta.chunk(index, text, with_logprobs(&update.logprobs), finish.as_ref(), so_far));
        }
        if usage.at_end {
            let cached_tokens = cached.iter().step_by(n.max(1)).sum();
            let usage = Usage::finished(prompt_tokens, completion_tokens, cached_tokens);
            yield json_event(&meta.response(Vec::new(), Some(usage)));
        }
        yield done_event();
    };
    Sse::new(events.map(Ok))
}

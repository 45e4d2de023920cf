//! `POST /v1/chat/completions`: messages rendered with the model's chat template (or as
//! harmony for gpt-oss, whose answers are split into reasoning and content), n choices,
//! streamed as `chat.completion.chunk` deltas or answered as one `chat.completion`.

use super::{check_model, off_runtime};
use crate::choice::{Choice, Finish};
use crate::error::ApiError;
use crate::harmony;
use crate::json_body::ApiJsonViews;
use crate::openapi::{ApiErrors, StreamEvent};
use crate::params::{check_prompt, check_sequences, logprobs_count};
use crate::protocol::chat::{
    ChatChoice, ChatLogprobs, ChatMessage, ChatRender, ChatRequest, ChatResponse, Delta, Message,
};
use crate::protocol::sampling::SamplingRequest;
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
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

/// The body: the route's own fields and the sampling fields, read as two views.
type ChatBody = ApiJsonViews<ChatRequest, SamplingRequest>;

/// What every chunk and the response repeat.
struct Meta {
    id: String,
    created: u64,
    model: String,
}

impl Meta {
    fn response(&self, object: &'static str, choices: Vec<ChatChoice>, usage: Option<Usage>) -> ChatResponse {
        ChatResponse {
            id: self.id.clone(),
            object,
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn chunk(
        &self,
        index: usize,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<&Finish>,
        usage: Option<Usage>,
    ) -> ChatResponse {
        let choice = ChatChoice {
            index,
            message: None,
            delta: Some(delta),
            logprobs,
            finish_reason: finish.map(|f| f.reason.as_str()),
            stop_reason: finish.and_then(|f| f.stop_reason.clone()),
        };
        self.response("chat.completion.chunk", vec![choice], usage)
    }
}

#[utoipa::path(post, path = "/v1/chat/completions", tag = "OpenAI", security(("api_key" = [])),
    request_body = ChatBody,
    responses(
        (status = 200, description = "The chat completion; with `stream`, server-sent events each holding a \
            `chat.completion.chunk` of the same shape (`delta` for `message`), then `data: [DONE]`",
            content((ChatResponse = "application/json"), (StreamEvent = "text/event-stream"))),
        ApiErrors,
    ))]
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJsonViews(req, sampling): ChatBody,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    check_model(&state, req.model.as_deref())?;
    if req.chat_template.as_ref().is_some_and(|t| !t.is_null()) {
        return Err(ApiError::invalid(
            Some("chat_template"),
            "chat_template: a template sent with the request is not supported; the model's is used",
        ));
    }
    let streaming = req.stream.unwrap_or(false);
    let usage = StreamUsage::of(streaming, req.stream_options.as_ref())?;
    let template = sampling.check(&state.model.sampling_defaults)?;
    check_sequences(1, template.n, state.config.max_sequences_per_request)?;
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
    )?;
    let harmony = state.model.harmony.clone();
    if harmony.is_some() && req.echo.unwrap_or(false) {
        return Err(ApiError::invalid(
            Some("echo"),
            "echo is not supported for harmony (gpt-oss) chats",
        ));
    }
    let role = answer_role(&req.messages, &render);
    let max_len = state.engine.max_model_len();
    let limit = template.tokens_before_truncation(max_len);
    let prompt = prompt_ids(&state, req.messages.clone(), render, req.add_special_tokens, limit).await?;
    let prompt = template.truncate(prompt, max_len)?;
    let echo = match req.echo.unwrap_or(false) {
        true => echoed(&req.messages, &role)?,
        false => String::new(),
    };
    check_prompt(prompt.len(), max_len, "messages")?;
    let (requested, param) = match req.max_completion_tokens {
        Some(m) => (Some(m), "max_completion_tokens"),
        None => (req.max_tokens, "max_tokens"),
    };
    // Without a limit, a chat answer may use the rest of the context.
    let budget = template.budget(requested, param, usize::MAX, prompt.len(), max_len)?;
    let mut template = template;
    if let Some(harmony) = &harmony {
        template.speak_harmony(harmony);
    }
    let requests = (0..template.n)
        .map(|i| template.request(&prompt, budget, logprobs, i))
        .collect();
    let choices = Choice::start_all(&state, requests, &template.text, arrived)?;
    let meta = Meta {
        id: response_id("chatcmpl", &headers),
        created: unix_time(),
        model: state.model.name.clone(),
    };
    if streaming {
        let opening = Delta {
            role: Some(role),
            content: Some(echo),
            reasoning_content: None,
        };
        let channels = harmony
            .is_some()
            .then(|| choices.iter().map(|_| harmony::Channels::default()).collect());
        return Ok(stream(meta, choices, opening, prompt.len(), usage, channels).into_response());
    }
    let outcomes = try_join_all(choices.into_iter().map(Choice::collect)).await?;
    let completion_tokens = outcomes.iter().map(|o| o.finish.completion_tokens).sum();
    let cached_tokens = outcomes[0].finish.cached_tokens;
    let choices = outcomes
        .into_iter()
        .enumerate()
        .map(|(index, o)| ChatChoice {
            index,
            message: Some(match harmony {
                Some(_) => {
                    let mut channels = harmony::Channels::default();
                    let (reasoning, content) = channels.split(&o.text, true);
                    Message {
                        role: role.clone(),
                        content,
                        reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    }
                }
                None => Message {
                    role: role.clone(),
                    content: echo.clone() + &o.text,
                    reasoning_content: None,
                },
            }),
            delta: None,
            logprobs: logprobs.map(|_| ChatLogprobs::new(&o.logprobs)),
            finish_reason: Some(o.finish.reason.as_str()),
            stop_reason: o.finish.stop_reason,
        })
        .collect();
    let usage = Usage::finished(prompt.len(), completion_tokens, cached_tokens);
    Ok(Json(meta.response("chat.completion", choices, Some(usage))).into_response())
}

/// The conversation's token ids through the model's chat template, rendered and tokenized
/// off the async workers; a text too long in bytes to make fewer than `limit` tokens is
/// refused before it is tokenized. The rendered template holds the special tokens it wants
/// (BOS included), so the tokenizer adds its own only when `add_special_tokens` asks.
pub(crate) async fn prompt_ids(
    state: &Arc<AppState>,
    messages: Vec<ChatMessage>,
    render: ChatRender,
    add_special_tokens: Option<bool>,
    limit: usize,
) -> Result<Vec<u32>, ApiError> {
    let state = state.clone();
    off_runtime(move || {
        let text = prompt_text(&state, &messages, &render)?;
        state
            .model
            .encode(&text, add_special_tokens.unwrap_or(false), limit, "messages")
    })
    .await
}

/// The conversation as prompt text: harmony for a gpt-oss model, else the model's chat template.
fn prompt_text(state: &AppState, messages: &[ChatMessage], render: &ChatRender) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "messages is empty"));
    }
    if state.model.harmony.is_some() {
        if render.continue_final_message || !render.add_generation_prompt {
            return Err(ApiError::invalid(
                Some("add_generation_prompt"),
                "harmony (gpt-oss) chats always open a new assistant turn: continue_final_message and \
                 add_generation_prompt false are not supported",
            ));
        }
        let effort = render.reasoning_effort.unwrap_or_default();
        return harmony::render(messages, effort, &harmony::today());
    }
    let template = state.model.chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            None,
            "this model has no chat template (tokenizer_config.json chat_template); use /v1/completions",
        )
    })?;
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.refuse_tool_calling(i)?;
            Ok(json!({"role": m.role, "content": m.text(i, "\n")?}))
        })
        .collect::<Result<Vec<Value>, ApiError>>()?;
    let mut extra = render.template_kwargs.clone();
    if let Some(effort) = render.reasoning_effort {
        extra.entry("reasoning_effort").or_insert(effort.as_str().into());
    }
    let rendered = match render.continue_final_message {
        true => template.render_continuing(&messages, &extra),
        false => template.render(&messages, render.add_generation_prompt, &extra),
    };
    rendered.map_err(|e| ApiError::invalid(Some("messages"), format!("chat template: {e}")))
}

/// The answer's role: the assistant's for a new turn, else (continuing or not) the final
/// message's, as vLLM names it.
fn answer_role(messages: &[ChatMessage], render: &ChatRender) -> String {
    match (render.add_generation_prompt, messages.last()) {
        (false, Some(last)) => last.role.clone(),
        _ => "assistant".into(),
    }
}

/// What `echo` starts the answer with: the final message's text when it has the answer's
/// role (vLLM's rule), else nothing.
fn echoed(messages: &[ChatMessage], role: &str) -> Result<String, ApiError> {
    let Some(last) = messages.last().filter(|m| m.role == role) else {
        return Ok(String::new());
    };
    Ok(last.text(messages.len() - 1, "\n")?.unwrap_or_default())
}

/// Streams the choices, each opening with `opening` (the role and any echo); a harmony
/// answer's text goes through its choice's `channels`.
fn stream(
    meta: Meta,
    choices: Vec<Choice>,
    opening: Delta,
    prompt_tokens: usize,
    usage: StreamUsage,
    mut channels: Option<Vec<harmony::Channels>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let with_logprobs = |tokens: &[TokenLogprob]| (!tokens.is_empty()).then(|| ChatLogprobs::new(tokens));
    let mut generated = vec![0; choices.len()];
    let events = async_stream::stream! {
        for index in 0..choices.len() {
            let delta = opening.clone();
            let so_far = usage.per_chunk.then(|| Usage::new(prompt_tokens, 0));
            yield json_event(&meta.chunk(index, delta, None, None, so_far));
        }
        let mut updates = merged(choices);
        let mut completion_tokens = 0;
        let mut cached_tokens = 0;
        while let Some((index, update)) = updates.next().await {
            let update = match update {
                Ok(update) => update,
                Err(e) => {
                    yield error_event(&e);
                    break;
                }
            };
            let finish = update.finish;
            if update.text.is_empty() && update.logprobs.is_empty() && finish.is_none() {
                continue;
            }
            completion_tokens += finish.as_ref().map_or(0, |f| f.completion_tokens);
            if index == 0 {
                cached_tokens = finish.as_ref().map_or(cached_tokens, |f| f.cached_tokens);
            }
            generated[index] += update.tokens;
            let so_far = usage.per_chunk.then(|| Usage::new(prompt_tokens, generated[index]));
            let (reasoning, content) = match channels.as_mut() {
                Some(channels) => channels[index].split(&update.text, finish.is_some()),
                None => (String::new(), update.text),
            };
            if reasoning.is_empty() && content.is_empty() && update.logprobs.is_empty() && finish.is_none() {
                continue;
            }
            let delta = Delta {
                role: None,
                content: (!content.is_empty()).then_some(content),
                reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
            };
            yield json_event(&meta.chunk(index, delta, with_logprobs(&update.logprobs), finish.as_ref(), so_far));
        }
        if usage.at_end {
            let usage = Usage::finished(prompt_tokens, completion_tokens, cached_tokens);
            yield json_event(&meta.response("chat.completion.chunk", Vec::new(), Some(usage)));
        }
        yield done_event();
    };
    Sse::new(events.map(Ok))
}

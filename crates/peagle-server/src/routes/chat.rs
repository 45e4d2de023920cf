//! `POST /v1/chat/completions`: messages rendered with the model's chat template (or as
//! harmony for gpt-oss), each choice's answer split into reasoning, content and tool calls by
//! its parser (`answer`), n choices, streamed as `chat.completion.chunk` deltas or answered as
//! one `chat.completion`.

use super::chat_start::{start_chat, ChatFields};
use super::check_model;
use crate::answer::{join_calls, AnswerParser, Split};
use crate::choice::{Choice, Finish};
use crate::error::ApiError;
use crate::json_body::ApiJsonViews;
use crate::openapi::{ApiErrors, StreamEvent};
use crate::protocol::chat::{ChatChoice, ChatLogprobs, ChatRequest, ChatResponse, Delta, Message};
use crate::protocol::sampling::SamplingRequest;
use crate::protocol::tools::{DeltaToolCall, ToolCall};
use crate::protocol::TokenLogprob;
use crate::protocol::{response_id, unix_time, StopReason, StreamUsage, Usage};
use crate::sse::{done_event, error_event, json_event, merged};
use crate::state::AppState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::try_join_all;
use futures_util::{Stream, StreamExt};
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
            prompt_logprobs: None,
        }
    }

    /// A chunk of choice `index`; `finish` on its last, with whether the choice ends in a call.
    fn chunk(
        &self,
        index: usize,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<(&Finish, bool)>,
        usage: Option<Usage>,
    ) -> ChatResponse {
        let choice = ChatChoice {
            index,
            message: None,
            delta: Some(delta),
            logprobs,
            finish_reason: finish.map(|(f, ends_in_call)| finish_reason(f, ends_in_call)),
            stop_reason: finish.and_then(|(f, _)| f.stop_reason.clone()),
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
    let streaming = req.stream.unwrap_or(false);
    let usage = StreamUsage::of(streaming, req.stream_options.as_ref())?;
    let fields = ChatFields {
        prompt: "messages",
        max_tokens: match req.max_completion_tokens {
            Some(m) => (Some(m), "max_completion_tokens"),
            None => (req.max_tokens, "max_tokens"),
        },
        held: None,
    };
    let chat = start_chat(&state, &req, sampling, fields, arrived).await?;
    let meta = Meta {
        id: response_id("chatcmpl-", &headers),
        created: unix_time(),
        model: state.model.name.clone(),
    };
    let parsers = chat.choices.iter().map(|_| chat.parser(&state.model)).collect();
    if streaming {
        let opening = Delta {
            role: Some(chat.role),
            content: Some(chat.echo),
            ..Delta::default()
        };
        return Ok(stream(meta, chat.choices, opening, chat.prompt_tokens, usage, parsers).into_response());
    }
    let mut outcomes = try_join_all(chat.choices.into_iter().map(Choice::collect)).await?;
    let completion_tokens = outcomes.iter().map(|o| o.finish.completion_tokens).sum();
    let cached_tokens = outcomes[0].finish.cached_tokens;
    // Every choice scores the same prompt.
    let prompt_logprobs = chat
        .prompt_logprobs
        .then(|| std::mem::take(&mut outcomes[0].prompt_logprobs));
    let choices = outcomes
        .into_iter()
        .zip(parsers)
        .enumerate()
        .map(|(index, (o, parser))| {
            let (message, ends_in_call) = answer_message(chat.role.clone(), &chat.echo, &o.text, parser);
            ChatChoice {
                index,
                finish_reason: Some(finish_reason(&o.finish, ends_in_call)),
                message: Some(message),
                delta: None,
                logprobs: chat.logprobs.map(|_| ChatLogprobs::new(&o.logprobs)),
                stop_reason: o.finish.stop_reason,
            }
        })
        .collect();
    let usage = Usage::finished(chat.prompt_tokens, completion_tokens, cached_tokens);
    let response = ChatResponse {
        prompt_logprobs,
        ..meta.response("chat.completion", choices, Some(usage))
    };
    Ok(Json(response).into_response())
}

/// An answer as a message, after `echo`: its reasoning, its content (null where it only
/// called tools) and its calls, each with a new id; and whether it ends in a call.
fn answer_message(role: String, echo: &str, text: &str, mut parser: AnswerParser) -> (Message, bool) {
    let split = parser.split(text, true);
    let calls: Vec<ToolCall> = join_calls(split.calls)
        .into_iter()
        .map(|(name, arguments)| ToolCall::new(name, arguments))
        .collect();
    let content = echo.to_string() + &split.content;
    // Null where the answer was only reasoning or calls, as vLLM has it.
    let nothing_else = split.reasoning.is_empty() && calls.is_empty();
    let message = Message {
        role,
        content: (!content.is_empty() || nothing_else).then_some(content),
        reasoning_content: (!split.reasoning.is_empty()).then_some(split.reasoning),
        tool_calls: (!calls.is_empty()).then_some(calls),
    };
    (message, parser.ends_in_call())
}

/// OpenAI's finish reason: a turn that stopped in a call (on harmony's `<|call|>`, or an end
/// token) ends for "tool_calls"; one cut short in a call keeps its own reason, "length", or
/// "stop" for a stop string, as its arguments may be cut too.
fn finish_reason(finish: &Finish, ends_in_call: bool) -> &'static str {
    let stop_string = matches!(finish.stop_reason, Some(StopReason::Text(_)));
    match finish.reason.as_str() {
        "stop" if ends_in_call && !stop_string => "tool_calls",
        reason => reason,
    }
}

/// Streams the choices, each opening with `opening` (the role and any echo), each choice's
/// text split by its parser.
fn stream(
    meta: Meta,
    choices: Vec<Choice>,
    opening: Delta,
    prompt_tokens: usize,
    usage: StreamUsage,
    mut parsers: Vec<AnswerParser>,
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
            let delta = delta(parsers[index].split(&update.text, finish.is_some()));
            let empty = delta.content.is_none() && delta.reasoning_content.is_none() && delta.tool_calls.is_none();
            if empty && update.logprobs.is_empty() && finish.is_none() {
                continue;
            }
            let finish = finish.as_ref().map(|f| (f, parsers[index].ends_in_call()));
            yield json_event(&meta.chunk(index, delta, with_logprobs(&update.logprobs), finish, so_far));
        }
        if usage.at_end {
            let usage = Usage::finished(prompt_tokens, completion_tokens, cached_tokens);
            yield json_event(&meta.response("chat.completion.chunk", Vec::new(), Some(usage)));
        }
        yield done_event();
    };
    Sse::new(events.map(Ok))
}

/// A stream chunk's delta from what an update added.
fn delta(split: Split) -> Delta {
    let calls: Vec<DeltaToolCall> = split
        .calls
        .into_iter()
        .map(|piece| match piece.name {
            Some(name) => DeltaToolCall::start(piece.index, name, piece.arguments),
            None => DeltaToolCall::more(piece.index, piece.arguments),
        })
        .collect();
    Delta {
        role: None,
        content: (!split.content.is_empty()).then_some(split.content),
        reasoning_content: (!split.reasoning.is_empty()).then_some(split.reasoning),
        tool_calls: (!calls.is_empty()).then_some(calls),
    }
}

#[cfg(test)]
#[path = "chat_tests.rs"]
mod tests;

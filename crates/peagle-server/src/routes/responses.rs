//! `POST /v1/responses`: OpenAI's Responses API over the chat machinery. The input is read as
//! a chat (`responses_input`), started as chats are (`chat_start`), and its answer written as
//! output items (`responses_output`): one `response` object, or with `stream` the Responses
//! stream's typed events, each with its sequence number, ending in `response.completed`
//! (`.incomplete` where the limit cut the answer, `.failed` where the server ended it), or in
//! an `error` event (`responses_stream`). A response asked to be stored (`store`, true by
//! default) is kept with its conversation (`responses_store`): `previous_response_id` goes on
//! from it, and `GET`/`DELETE /v1/responses/{id}` read and forget it. One asked to run in the
//! background is answered by a task of its own (`responses_background`), which these read
//! while it runs.

use super::chat_start::start_chat;
use super::off_runtime;
use super::responses_background::run_in_background;
use super::responses_input::chat_request;
use super::responses_items::input_items;
use super::responses_logprobs::TextEntries;
use super::responses_output::OutputItems;
use super::responses_stream::{sse_of, sse_of_saved};
use crate::choice::{Choice, Finish};
use crate::error::ApiError;
use crate::json_body::ApiJsonViews;
use crate::openapi::{ApiErrors, StreamEvent};
use crate::protocol::chat::ChatMessage;
use crate::protocol::responses::{
    DeletedResponse, IncompleteDetails, InputTokensDetails, OutputTokensDetails, ReasoningConfig, ResponseError,
    ResponseObject, ResponseUsage, ResponsesRequest, ResponsesTool, TextConfig,
};
use crate::protocol::sampling::SamplingRequest;
use crate::protocol::{random_id, unix_time};
use crate::responses_runs::{Run, SavedEvent};
use crate::responses_store::Stored;
use crate::state::AppState;
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use peagle_engine::FinishReason;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;
use utoipa::IntoParams;

/// The body: the route's own fields and the sampling fields, read as two views.
type ResponsesBody = ApiJsonViews<ResponsesRequest, SamplingRequest>;

#[utoipa::path(post, path = "/v1/responses", tag = "OpenAI", security(("api_key" = [])),
    request_body = ResponsesBody,
    responses(
        (status = 200, description = "The response; with `stream`, server-sent events of the Responses API, \
            each a typed event (`response.created`, `response.output_text.delta`, ...) with its sequence number",
            content((ResponseObject = "application/json"), (StreamEvent = "text/event-stream"))),
        ApiErrors,
    ))]
pub async fn responses(
    State(state): State<Arc<AppState>>,
    ApiJsonViews(req, sampling): ResponsesBody,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    if sampling.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid(Some("n"), "n: a response is one answer"));
    }
    if sampling.prompt_logprobs.is_some() {
        return Err(ApiError::invalid(
            Some("prompt_logprobs"),
            "prompt_logprobs: a response has no place for them; use /v1/chat/completions",
        ));
    }
    let previous = previous_response(&state, req.previous_response_id.as_deref())?;
    let before = previous.as_ref().map_or(&[][..], |p| &p.conversation[..]);
    let (chat, fields) = chat_request(&req, before)?;
    let store = req.store.unwrap_or(true) && state.responses.enabled();
    let background = req.background.unwrap_or(false);
    if background && !store {
        return Err(ApiError::invalid(
            Some("background"),
            "background: a background response is read from the store, so it needs store (not false) and a \
             server that keeps responses (--responses-store-mb above 0)",
        ));
    }
    // What a later response goes on from: the conversation without its instructions, which
    // it does not inherit; and what its input items list.
    let kept = store.then(|| Kept {
        conversation: chat.messages[usize::from(req.instructions.is_some())..].to_vec(),
        input_items: json!(input_items(&req.input)).to_string(),
    });
    // Never the client's X-Request-Id: a stored response is found by its id, which no
    // client may choose (and so read or replace another's).
    let id = format!("resp_{}", random_id());
    let head = Head::new(&req, &sampling, id, &state.model.name, store);
    let started = start_chat(&state, &chat, sampling, fields, arrived).await?;
    let stream = req.stream.unwrap_or(false);
    if background {
        return Ok(run_in_background(state, head, started, kept, stream));
    }
    if stream {
        return Ok(sse_of(state, head, started, kept).into_response());
    }
    let mut parser = started.parser(&state.model);
    let prompt_tokens = started.prompt_tokens;
    let mut output = OutputItems::new(started.logprobs.is_some());
    let outcome = only_choice(started.choices)?.collect().await?;
    let (text, tokens) = (&outcome.text, outcome.logprobs);
    TextEntries::default().add(&mut parser, &mut output, text, tokens, &outcome.released, true);
    let response = head.finished(&state, &mut output, &outcome.finish, prompt_tokens).await;
    keep(&state, &response, kept, output.answer(), Vec::new());
    Ok(Json(response).into_response())
}

#[utoipa::path(get, path = "/v1/responses/{id}", tag = "OpenAI", security(("api_key" = [])),
    params(("id" = String, Path, description = "A stored or running response's id"), RetrieveQuery),
    responses(
        (status = 200, description = "The response as it stands: as it was answered, or a background one's so \
            far; with `stream`, a background response's events after `starting_after`, then those to come",
            content((ResponseObject = "application/json"), (StreamEvent = "text/event-stream"))),
        ApiErrors,
    ))]
pub async fn get_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<RetrieveQuery>,
) -> Result<Response, ApiError> {
    let found = find(&state, &id)?;
    if query.stream != Some(true) {
        let response = match &found {
            Found::Running(run) => run.response(),
            Found::Stored(stored) => stored.response.clone(),
        };
        return Ok(([(CONTENT_TYPE, "application/json")], response).into_response());
    }
    let from = match query.starting_after {
        Some(n) if n < -1 => {
            return Err(ApiError::invalid(
                Some("starting_after"),
                format!("starting_after: a sequence number, -1 or more, not {n}"),
            ))
        }
        // Event n has sequence number n.
        Some(n) => (n + 1) as usize,
        None => 0,
    };
    match found {
        Found::Running(run) => Ok(sse_of_saved(run.follow(from)).into_response()),
        Found::Stored(stored) if !stored.events.is_empty() => {
            let events = stored.events.get(from..).unwrap_or_default().to_vec();
            Ok(sse_of_saved(futures_util::stream::iter(events)).into_response())
        }
        Found::Stored(_) => Err(ApiError::invalid(
            Some("stream"),
            "stream: only a background response's events are kept to be streamed again",
        )),
    }
}

/// A response by id: a background one still running, or one stored.
pub(super) enum Found {
    Running(Arc<Run>),
    Stored(Arc<Stored>),
}

/// The response `id`; 404 where it is neither running nor kept. A run puts its response in
/// the store before it leaves the runs, so one is always found.
pub(super) fn find(state: &AppState, id: &str) -> Result<Found, ApiError> {
    if let Some(run) = state.runs.get(id) {
        return Ok(Found::Running(run));
    }
    let stored = state.responses.get(id).ok_or_else(|| not_found(id, None))?;
    Ok(Found::Stored(stored))
}

/// `GET /v1/responses/{id}`'s query: OpenAI's SDK may ask to stream a background response
/// again.
#[derive(Debug, Deserialize, IntoParams)]
pub struct RetrieveQuery {
    /// The background response's events, as a stream, rather than the response.
    stream: Option<bool>,
    /// With `stream`: the events after this sequence number.
    starting_after: Option<i64>,
}

#[utoipa::path(delete, path = "/v1/responses/{id}", tag = "OpenAI", security(("api_key" = [])),
    params(("id" = String, Path, description = "A stored response's id")),
    responses((status = 200, description = "The response is forgotten (cancelled first where it runs in the \
        background)", body = DeletedResponse), ApiErrors))]
pub async fn delete_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<DeletedResponse>, ApiError> {
    if let Some(run) = state.runs.get(&id) {
        run.cancel();
        run.wait_done().await;
    }
    if !state.responses.remove(&id) {
        return Err(not_found(&id, None));
    }
    Ok(Json(DeletedResponse {
        id,
        object: "response.deleted",
        deleted: true,
    }))
}

/// The stored response a request goes on from; 404 for one not kept (never stored, or
/// forgotten for room), 400 where the server keeps none.
fn previous_response(state: &AppState, id: Option<&str>) -> Result<Option<Arc<Stored>>, ApiError> {
    let Some(id) = id else {
        return Ok(None);
    };
    if !state.responses.enabled() {
        return Err(ApiError::invalid(
            Some("previous_response_id"),
            "previous_response_id: this server keeps no responses (--responses-store-mb 0); send the whole \
             conversation as input",
        ));
    }
    if state.runs.get(id).is_some() {
        return Err(ApiError::invalid(
            Some("previous_response_id"),
            format!("previous_response_id: response {id:?} is still running in the background"),
        ));
    }
    let stored = state
        .responses
        .get(id)
        .ok_or_else(|| not_found(id, Some("previous_response_id")))?;
    if stored.failed {
        return Err(ApiError::invalid(
            Some("previous_response_id"),
            format!("previous_response_id: response {id:?} failed, so its answer is not whole to go on from"),
        ));
    }
    Ok(Some(stored))
}

pub(super) fn not_found(id: &str, param: Option<&str>) -> ApiError {
    ApiError {
        param: param.map(str::to_string),
        ..ApiError::client(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("Response with id {id:?} not found: never stored, deleted, or forgotten for room"),
        )
    }
}

/// What a response to be stored keeps of its request: the conversation through its input
/// (its instructions aside) and its input items as the listing gives them.
pub(super) struct Kept {
    conversation: Vec<ChatMessage>,
    input_items: String,
}

/// Keeps a finished response, with the conversation it ends (through `answer`), where its
/// request asked to store it (`kept`), with a background response's stream `events`.
pub(super) fn keep(
    state: &AppState,
    response: &ResponseObject,
    kept: Option<Kept>,
    answer: ChatMessage,
    events: Vec<SavedEvent>,
) {
    let Some(Kept {
        mut conversation,
        input_items,
    }) = kept
    else {
        return;
    };
    let Ok(json) = serde_json::to_string(response) else {
        return;
    };
    conversation.push(answer);
    let stored = Stored {
        response: json,
        input_items,
        conversation,
        failed: response.status == "failed",
        events,
    };
    state.responses.put(response.id.clone(), stored);
}

/// A response's one choice (`n` is refused above 1).
pub(super) fn only_choice(choices: Vec<Choice>) -> Result<Choice, ApiError> {
    choices
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::internal("a response started without its choice"))
}

/// What every state of the response repeats: its id and the request's settings.
pub(super) struct Head {
    id: String,
    background: bool,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    metadata: Option<Value>,
    parallel_tool_calls: bool,
    previous_response_id: Option<String>,
    reasoning: Option<ReasoningConfig>,
    store: bool,
    temperature: Option<f32>,
    top_logprobs: i64,
    top_p: Option<f32>,
    text: TextConfig,
    tool_choice: Value,
    tools: Vec<ResponsesTool>,
    user: Option<String>,
}

impl Head {
    fn new(req: &ResponsesRequest, sampling: &SamplingRequest, id: String, model: &str, store: bool) -> Self {
        let text = req.text.clone().filter(|t| t.format.is_some());
        Self {
            id,
            background: req.background.unwrap_or(false),
            created_at: unix_time(),
            model: model.to_string(),
            instructions: req.instructions.clone(),
            max_output_tokens: req.max_output_tokens,
            metadata: req.metadata.clone(),
            parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
            previous_response_id: req.previous_response_id.clone(),
            reasoning: req.reasoning.clone(),
            store,
            temperature: sampling.temperature,
            top_logprobs: req.top_logprobs.unwrap_or(0),
            top_p: sampling.top_p,
            text: text.unwrap_or(TextConfig {
                format: Some(json!({"type": "text"})),
            }),
            tool_choice: req
                .tool_choice
                .clone()
                .filter(|c| !c.is_null())
                .unwrap_or(json!("auto")),
            tools: req.tools.clone().unwrap_or_default(),
            user: req.user.clone(),
        }
    }

    pub(super) fn id(&self) -> &str {
        &self.id
    }

    /// The response before its answer: queued where it runs in the background, else in
    /// progress.
    pub(super) fn opening(&self) -> ResponseObject {
        let status = if self.background { "queued" } else { "in_progress" };
        self.object(status, &OutputItems::default(), None)
    }

    /// The response in `status`, holding `output`.
    pub(super) fn object(
        &self,
        status: &'static str,
        output: &OutputItems,
        usage: Option<ResponseUsage>,
    ) -> ResponseObject {
        let finished = !matches!(status, "queued" | "in_progress");
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            background: self.background,
            status,
            completed_at: (status == "completed").then(unix_time),
            error: (status == "failed").then(|| ResponseError {
                code: "server_error",
                message: "the answer was ended before it finished: the server is stopping or its engine failed".into(),
            }),
            incomplete_details: (status == "incomplete").then_some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
            instructions: self.instructions.clone(),
            max_output_tokens: self.max_output_tokens,
            metadata: self.metadata.clone(),
            model: self.model.clone(),
            output: output.items().to_vec(),
            parallel_tool_calls: self.parallel_tool_calls,
            previous_response_id: self.previous_response_id.clone(),
            reasoning: self.reasoning.clone(),
            store: self.store,
            temperature: self.temperature,
            text: self.text.clone(),
            tool_choice: self.tool_choice.clone(),
            tools: self.tools.clone(),
            top_logprobs: self.top_logprobs,
            top_p: self.top_p,
            truncation: "disabled",
            usage: usage.filter(|_| finished),
            user: self.user.clone(),
        }
    }

    /// The finished response: `output` closed as `finish` ends it, with the usage.
    pub(super) async fn finished(
        &self,
        state: &Arc<AppState>,
        output: &mut OutputItems,
        finish: &Finish,
        prompt_tokens: usize,
    ) -> ResponseObject {
        let status = status(finish);
        output.finish(if status == "completed" {
            "completed"
        } else {
            "incomplete"
        });
        let reasoning_tokens = reasoning_tokens(state, output.reasoning_text()).await;
        let usage = ResponseUsage {
            input_tokens: prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: finish.cached_tokens,
            },
            output_tokens: finish.completion_tokens,
            output_tokens_details: OutputTokensDetails { reasoning_tokens },
            total_tokens: prompt_tokens + finish.completion_tokens,
        };
        self.object(status, output, Some(usage))
    }
}

/// The reasoning's tokens, as the tokenizer encodes its text (off the async workers).
async fn reasoning_tokens(state: &Arc<AppState>, text: String) -> usize {
    if text.is_empty() {
        return 0;
    }
    let state = state.clone();
    let ids = off_runtime(move || state.model.encode_words(&text)).await;
    ids.map_or(0, |ids| ids.len())
}

/// The response's status as the answer ended: cut by `max_output_tokens` (or the context)
/// it is incomplete, and ended early by the server it failed.
fn status(finish: &Finish) -> &'static str {
    match finish.reason {
        FinishReason::Length => "incomplete",
        FinishReason::Abort => "failed",
        FinishReason::Stop | FinishReason::StopToken(_) => "completed",
    }
}

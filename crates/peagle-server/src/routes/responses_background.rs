//! Background responses (`background: true`): the request returns the response queued, or
//! with `stream` follows its events, while a task of its own answers it to the end whether or
//! not any client reads. The task writes each event to the response's run
//! (`responses_runs`), which `GET /v1/responses/{id}` reads, and at the end stores the
//! response with its events before the run goes, so that it is found all along.
//! `POST /v1/responses/{id}/cancel` stops it.

use super::chat_start::StartedChat;
use super::responses::{find, keep, Found, Head, Kept};
use super::responses_stream::{answer_steps, closing_event, sse_of_saved, Sequence, Step};
use crate::error::ApiError;
use crate::openapi::ApiErrors;
use crate::protocol::responses::ResponseObject;
use crate::responses_runs::Run;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use std::sync::Arc;

/// Starts the task that answers `started` in the background, and answers the request: the
/// response queued, or with `stream` its events as they come.
pub(super) fn run_in_background(
    state: Arc<AppState>,
    head: Head,
    started: StartedChat,
    kept: Option<Kept>,
    stream: bool,
) -> Response {
    let queued = head.opening();
    let id = head.id().to_string();
    let run = Run::new(json_of(&queued));
    state.runs.insert(id.clone(), run.clone());
    let steps = answer_steps(state.clone(), head, started, run.cancelled());
    tokio::spawn(answer(state, id, run.clone(), steps, kept));
    if stream {
        sse_of_saved(run.follow(0)).into_response()
    } else {
        Json(queued).into_response()
    }
}

/// Writes the answer's events to `run` as they come, its response as it stands, and at the
/// end stores it and retires the run.
async fn answer(
    state: Arc<AppState>,
    id: String,
    run: Arc<Run>,
    steps: impl futures_util::Stream<Item = Step>,
    mut kept: Option<Kept>,
) {
    let mut steps = std::pin::pin!(steps);
    let mut sequence = Sequence::default();
    while let Some(step) = steps.next().await {
        match step {
            Step::Event(event) => {
                if event["type"] == "response.in_progress" {
                    run.set_response(event["response"].to_string());
                }
                run.push(sequence.number(event));
            }
            Step::End {
                response,
                answer,
                closing,
            } => {
                if closing {
                    run.push(sequence.number(closing_event(&response)));
                }
                run.set_response(json_of(&response));
                keep(&state, &response, kept.take(), answer, run.events());
            }
        }
    }
    run.finish();
    state.runs.remove(&id);
}

fn json_of(response: &ResponseObject) -> String {
    serde_json::to_string(response).unwrap_or_default()
}

#[utoipa::path(post, path = "/v1/responses/{id}/cancel", tag = "OpenAI", security(("api_key" = [])),
    params(("id" = String, Path, description = "A background response's id")),
    responses((status = 200, description = "The response as it ended: cancelled, or as it had already ended",
        body = ResponseObject), ApiErrors))]
pub async fn cancel_response(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let response = match find(&state, &id)? {
        Found::Running(run) => {
            run.cancel();
            run.wait_done().await;
            run.response()
        }
        // Only a background response keeps its events.
        Found::Stored(stored) if stored.events.is_empty() => {
            return Err(ApiError::invalid(None, "only background responses can be cancelled"))
        }
        Found::Stored(stored) => stored.response.clone(),
    };
    Ok(([(CONTENT_TYPE, "application/json")], response).into_response())
}

//! `GET /v1/models` (and `/v1/models/{id}`), `GET /health` and `GET /metrics`.

use super::check_model;
use crate::error::ApiError;
use crate::protocol::random_id;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::Json;
use peagle_engine::SubmitError;
use serde_json::{json, Value};
use std::sync::Arc;

pub async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [card(&state)]}))
}

/// `GET /v1/models/{id}`: the served model's card, or 404 for any other name.
pub async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    check_model(&state, Some(&id))?;
    Ok(Json(card(&state)))
}

fn card(state: &AppState) -> Value {
    json!({
        "id": state.model.name,
        "object": "model",
        "created": state.model.created,
        "owned_by": "peagle",
        "root": state.model.name,
        "parent": null,
        "max_model_len": state.engine.max_model_len(),
        // What OpenAI's legacy model objects carried, and vLLM still sends.
        "permission": [{
            "id": format!("modelperm-{}", random_id()),
            "object": "model_permission",
            "created": state.model.created,
            "allow_create_engine": false,
            "allow_sampling": true,
            "allow_logprobs": true,
            "allow_search_indices": false,
            "allow_view": true,
            "allow_fine_tuning": false,
            "organization": "*",
            "group": null,
            "is_blocking": false,
        }],
    })
}

/// 200 while the server runs, 503 once it is shutting down, so load balancers stop sending
/// it work; the test scripts wait for the 200.
pub async fn health(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    match *state.stopping.borrow() {
        true => Err(SubmitError::ShuttingDown.into()),
        false => Ok(Json(json!({"status": "ok"}))),
    }
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let text = state.metrics.render(&state.engine.metrics(), &state.model.name);
    ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}

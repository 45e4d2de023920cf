//! `GET /v1/models`, `GET /health` and `GET /metrics`.

use crate::state::AppState;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

pub async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.model.name,
            "object": "model",
            "created": state.model.created,
            "owned_by": "peagle",
            "max_model_len": state.engine.max_model_len(),
        }],
    }))
}

/// 200 while the server runs; load balancers and the test scripts wait for it.
pub async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let text = state.metrics.render(&state.engine.metrics(), &state.model.name);
    ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}

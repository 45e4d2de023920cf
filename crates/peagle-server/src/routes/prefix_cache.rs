//! `POST /reset_prefix_cache` (vLLM's): forget every cached prefix, for benchmarks that must
//! start cold and after changing what identical prompts should compute.

use crate::openapi::ApiErrors;
use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use std::sync::Arc;

#[utoipa::path(post, path = "/reset_prefix_cache", tag = "vLLM", security(("api_key" = [])),
    responses((status = 200, description = "Every cached prefix is forgotten"), ApiErrors))]
pub async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> StatusCode {
    state.engine.reset_prefix_cache();
    StatusCode::OK
}

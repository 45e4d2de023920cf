//! `POST /reset_prefix_cache` (vLLM's): forget every cached prefix, for benchmarks that must
//! start cold and after changing what identical prompts should compute.

use crate::state::AppState;
use axum::extract::State;
use axum::http::StatusCode;
use std::sync::Arc;

pub async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> StatusCode {
    state.engine.reset_prefix_cache();
    StatusCode::OK
}

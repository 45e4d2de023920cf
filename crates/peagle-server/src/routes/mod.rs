//! The HTTP handlers, one file per endpoint family.

pub mod chat;
mod chat_prompt;
pub mod completions;
pub mod info;
pub mod prefix_cache;
pub mod tokenize;

use crate::error::ApiError;
use crate::state::AppState;

/// Runs CPU-heavy request preparation (tokenizing, rendering the chat template) on the
/// blocking pool, so a huge prompt does not stall the async workers every connection shares.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
}

/// Requests name the served model (or leave `model` out); anything else is 404, as OpenAI
/// and vLLM answer.
fn check_model(state: &AppState, requested: Option<&str>) -> Result<(), ApiError> {
    match requested {
        None | Some("") => Ok(()),
        Some(name) if name == state.model.name => Ok(()),
        Some(name) => Err(ApiError::model_not_found(name)),
    }
}

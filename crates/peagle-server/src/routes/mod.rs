//! The HTTP handlers, one file per endpoint family.

pub mod chat;
mod chat_prompt;
mod chat_start;
pub mod completions;
pub mod info;
pub mod prefix_cache;
pub mod responses;
pub mod responses_background;
mod responses_input;
pub mod responses_items;
mod responses_logprobs;
mod responses_output;
mod responses_stream;
pub mod tokenize;

use crate::error::ApiError;
use crate::params::ChoiceTemplate;
use crate::state::AppState;
use peagle_engine::StructuredOutput;
use std::sync::Arc;

/// Runs CPU-heavy request preparation (tokenizing, rendering the chat template) on the
/// blocking pool, so a huge prompt does not stall the async workers every connection shares.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
}

/// Compiles the structured output `template` asks for (off the async workers: the first
/// state's tokens are a walk of the vocabulary), to start after `trigger` (empty: at once).
async fn constrain(state: &Arc<AppState>, template: &mut ChoiceTemplate, trigger: Vec<u32>) -> Result<(), ApiError> {
    let Some(asked) = template.structured.clone() else {
        return Ok(());
    };
    let state = state.clone();
    let constraint = off_runtime(move || state.model.constraints.compile(state.model.tokenizer(), &asked)).await?;
    template.constrain(StructuredOutput { constraint, trigger });
    Ok(())
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

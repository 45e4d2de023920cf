//! The HTTP handlers, one file per endpoint family.

pub mod chat;
pub mod completions;
pub mod info;
pub mod tokenize;

use crate::error::ApiError;
use crate::state::AppState;

/// Requests name the served model (or leave `model` out); anything else is 404, as OpenAI
/// and vLLM answer.
fn check_model(state: &AppState, requested: Option<&str>) -> Result<(), ApiError> {
    match requested {
        None | Some("") => Ok(()),
        Some(name) if name == state.model.name => Ok(()),
        Some(name) => Err(ApiError::model_not_found(name)),
    }
}

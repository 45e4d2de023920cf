//! The engine's errors: why it could not be built or a step failed, and why a request was
//! refused.

use crate::block_manager::OutOfBlocks;
use crate::request::InvalidRequest;
use peagle_models::LoadError;
use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum GenerateError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("missing tokenizer: {0}")]
    MissingTokenizer(PathBuf),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("model forward failed: {0}")]
    Model(#[from] candle_core::Error),
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
    #[error(transparent)]
    OutOfBlocks(#[from] OutOfBlocks),
    #[error("{0}")]
    Config(String),
    /// A step that ran the request failed.
    #[error("{0}")]
    Step(String),
}

#[derive(Debug, Error, PartialEq)]
pub enum SubmitError {
    /// Bad request: the error names the field at fault.
    #[error(transparent)]
    Invalid(InvalidRequest),
    #[error("the server is busy: {waiting} sequences are waiting (limit {limit}); retry later")]
    QueueFull { waiting: usize, limit: usize },
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The engine thread died (a step panicked): nothing runs any more.
    #[error("the engine failed: {0}")]
    EngineDead(String),
}

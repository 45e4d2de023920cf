//! From model directories to a running engine: build it (see `peagle_engine::EngineBuilder`),
//! start its thread, and read the tokenizer and chat template for the HTTP side.

use crate::served_model::{ModelFilesError, Parsers, ServedModel};
use peagle_engine::{EngineBuilder, EngineHandle, GenerateError};
use peagle_models::SamplingDefaults;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum StartError {
    #[error(transparent)]
    Engine(#[from] GenerateError),
    #[error(transparent)]
    ModelFiles(#[from] ModelFilesError),
}

/// Loads everything and starts the engine; the model is served under `name`, its chats
/// rendered by `chat_template` (a file or the template itself) when given, their answers
/// split by `parsers` (`ServedModel::from_dir`).
pub fn start_engine(
    name: String,
    builder: &EngineBuilder,
    chat_template: Option<&str>,
    parsers: Parsers,
) -> Result<(EngineHandle, ServedModel), StartError> {
    let mut served = ServedModel::from_dir(name, &builder.model_dir, chat_template, parsers)?;
    let built = builder.build()?;
    served.sampling_defaults = built.sampling_defaults;
    if served.sampling_defaults != SamplingDefaults::default() {
        tracing::info!(
            defaults = ?served.sampling_defaults,
            "requests that leave sampling fields out get the generation config's values"
        );
    }
    Ok((EngineHandle::start(built.engine), served))
}

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{path}: {message}")]
    Data { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("invalid training setup: {0}")]
    Invalid(String),
    #[error("plot: {0}")]
    Plot(String),
    #[error(transparent)]
    Load(#[from] peagle_models::LoadError),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl TrainError {
    pub fn data(path: &Path, message: impl Into<String>) -> Self {
        Self::Data {
            path: path.to_owned(),
            message: message.into(),
        }
    }

    pub fn io(path: &Path, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Io {
            path: path.to_owned(),
            source: Box::new(source),
        }
    }
}

use std::path::PathBuf;
use thiserror::Error;

/// Why a model directory could not be loaded; every variant names the file or tensor at fault.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("missing {what}: {path}")]
    MissingFile { what: &'static str, path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {path}: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{path}: {msg}")]
    InvalidConfig { path: PathBuf, msg: String },
    #[error("{path}: unknown architecture {found:?}; supported: {}", supported.join(", "))]
    UnknownArchitecture {
        path: PathBuf,
        found: String,
        supported: Vec<&'static str>,
    },
    #[error("tensor {name} not found in {dir}")]
    MissingTensor { name: String, dir: PathBuf },
    #[error("tensor {name} in {file}: expected shape {expected:?}, found {found:?}")]
    ShapeMismatch {
        name: String,
        file: PathBuf,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor {name} in {file}: unsupported dtype {dtype} (supported: F32, BF16, F16)")]
    UnsupportedDtype { name: String, file: PathBuf, dtype: String },
    #[error("tensor {name}: {msg}")]
    InvalidTensor { name: String, msg: String },
    /// The device or dtype asked for cannot be used.
    #[error("{0}")]
    Placement(String),
    #[error("{context}: {source}")]
    Candle {
        context: String,
        source: candle_core::Error,
    },
}

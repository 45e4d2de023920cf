use std::path::PathBuf;

/// Display gives the context only: callers print the `source` chain (anyhow's `{:#}`), so it
/// is not repeated.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot reach {url}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("{url} answered {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("bad response from {url}: {reason}")]
    BadResponse { url: String, reason: String },
    #[error("cannot read dataset {path}")]
    DatasetIo { path: PathBuf, source: std::io::Error },
    #[error("dataset {path} line {line}: {reason}")]
    DatasetLine { path: PathBuf, line: usize, reason: String },
    #[error("dataset {path} has no prompts")]
    EmptyDataset { path: PathBuf },
    #[error("cannot write {path}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Plot(#[from] peagle_plot::PlotError),
    #[error("{what}: {reason}")]
    Server { what: String, reason: String },
}

/// An error and its sources, one after the other, as anyhow's `{:#}` prints them.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

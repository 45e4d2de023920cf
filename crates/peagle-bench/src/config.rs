use serde::Serialize;
use std::path::PathBuf;

/// What to run: recorded as-is in `result.json` so a result says how it was produced.
#[derive(Debug, Clone, Serialize)]
pub struct BenchConfig {
    /// Base URL of the server, e.g. `http://127.0.0.1:8000`.
    pub url: String,
    pub dataset: PathBuf,
    pub num_prompts: usize,
    pub concurrency: Vec<usize>,
    pub max_tokens: usize,
    pub temperature: f64,
    /// None: the first model the server lists.
    pub model: Option<String>,
}

use serde::Serialize;
use std::path::PathBuf;

/// What to run: recorded as-is in `result.json` so a result says how it was produced.
#[derive(Debug, Clone, Serialize)]
pub struct BenchConfig {
    /// Base URL of the server, e.g. `http://127.0.0.1:8000`.
    pub url: String,
    /// None: the first model the server lists.
    pub model: Option<String>,
    #[serde(flatten)]
    pub workload: Workload,
}

/// The requests of a benchmark: the same for `serve` and for every mode of a `sweep`.
#[derive(Debug, Clone, Serialize, clap::Args)]
pub struct Workload {
    /// JSONL file of {"prompt": ...} lines.
    #[arg(long)]
    pub dataset: PathBuf,
    /// Prompts per level: the dataset's first N, cycled if it has fewer.
    #[arg(long, default_value_t = 100, value_parser = prompt_count)]
    pub num_prompts: usize,
    /// Comma-separated maximum requests in flight, one level each.
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = positive)]
    pub concurrency: Vec<usize>,
    /// New tokens per request (EOS is ignored so every request makes exactly this many).
    #[arg(long, default_value_t = 256, value_parser = positive)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Streaming completions, or chat completions with the prompt as the user message.
    #[arg(long, value_enum, default_value_t = Endpoint::Completions)]
    pub endpoint: Endpoint,
}

/// Which OpenAI route the requests use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `POST /v1/completions` with the prompt as text.
    Completions,
    /// `POST /v1/chat/completions` with the prompt as one user message.
    Chat,
}

impl Endpoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat",
        }
    }
}

/// The most prompts a level sends: each is held in memory before the level starts.
pub const MAX_PROMPTS: usize = 1_000_000;

/// A count of prompts per level: positive, and at most `MAX_PROMPTS`.
fn prompt_count(text: &str) -> Result<usize, String> {
    match positive(text)? {
        n if n > MAX_PROMPTS => Err(format!("must be at most {MAX_PROMPTS}")),
        n => Ok(n),
    }
}

/// A count of 0 (concurrency, K, repeats) would measure nothing.
pub fn positive(text: &str) -> Result<usize, String> {
    match text.parse() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{e}")),
    }
}

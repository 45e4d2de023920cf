//! `peagle-bench`: drives an OpenAI-compatible server with streaming completions and measures
//! throughput, latency (TTFT, TPOT, ITL) and, where the server exports them, speculative acceptance.

mod bench;
mod config;
mod dataset;
mod error;
mod level;
mod metrics;
mod report;
mod request;
mod sse;
mod stats;

pub use bench::{run, BenchResult};
pub use config::BenchConfig;
pub use dataset::load_prompts;
pub use error::BenchError;
pub use level::LevelResult;
pub use report::{summary_table, write_report};
pub use request::{per_token_gaps, RequestRecord};
pub use stats::{percentile, Summary};

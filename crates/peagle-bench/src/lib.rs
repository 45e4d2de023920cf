//! `peagle-bench`: drives an OpenAI-compatible server with streaming completions and measures
//! throughput, latency (TTFT, TPOT, ITL) and, where the server exports them, speculative
//! acceptance; `sweep` compares speculation modes, each on its own `peagle-serve`, and
//! `prefix` measures prefix caching against none.

mod bench;
mod config;
mod dataset;
mod error;
mod level;
mod metrics;
mod prefix;
mod report;
mod request;
mod server_process;
mod sse;
mod stats;
mod sweep;
mod sweep_report;

pub use bench::{run, BenchResult};
pub use config::{positive, BenchConfig, Endpoint, Workload};
pub use dataset::load_prompts;
pub use error::BenchError;
pub use level::LevelResult;
pub use metrics::{counter, StepBreakdown};
pub use prefix::{run_prefix, write_prefix_report, PrefixConfig, PrefixReport, PrefixRun};
pub use report::{summary_table, write_report};
pub use request::{per_token_gaps, RequestRecord};
pub use stats::{percentile, Summary};
pub use sweep::{modes, run_sweep, Method, Mode, SweepConfig, SweepFailure, SweepOutcome, SweepRun};
pub use sweep_report::{compare, sweep_table, write_sweep_report, SweepReport, SweepRow};

//! The engine's counters and gauges, published after every step for /metrics.

use crate::spec_stats::SpecStats;
use crate::step_times::StepTimes;

/// Counters for /metrics; a snapshot is cheap to take.
#[derive(Debug, Clone, Default)]
pub struct EngineMetrics {
    pub running: usize,
    pub waiting: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub requests_finished_stop: u64,
    pub requests_finished_length: u64,
    pub requests_aborted: u64,
    pub preemptions_total: u64,
    /// Prompt tokens of scheduled requests, and those the prefix cache held (vLLM's
    /// prefix_cache_queries and prefix_cache_hits).
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Free blocks that still hold a cached prefix.
    pub kv_blocks_cached_free: usize,
    pub spec: SpecStats,
    /// Drafts per step in use now (0 when speculation is off or suspended under load).
    pub k_in_use: usize,
    pub step_times: StepTimes,
}

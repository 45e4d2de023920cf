//! Where the engine's time goes, cumulative since it started: deltas over a benchmark level
//! give the cost of a step by phase (what `peagle-bench` reports).

use serde::Serialize;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepTimes {
    pub steps: u64,
    /// Target forward passes (prefill chunks and verification windows), to the end of their
    /// kernels on a GPU, and of the device's choices of their rows issued behind them.
    pub target_seconds: f64,
    /// Drafter passes. On a GPU a steady decode step does not wait for its drafter's kernels:
    /// this is the host's time to issue them, and their GPU time is in the next step's
    /// `target_seconds`, whose forward waits for them. A step unlike the next (with prefill
    /// work, at a new k, or at k = 0) waits for them (`Engine::step_at`).
    pub drafter_seconds: f64,
    /// Verification, sampling, log-probabilities and commits.
    pub verify_seconds: f64,
    /// The rest of each step: scheduling, block bookkeeping, handing tokens to the requests.
    pub other_seconds: f64,
}

impl StepTimes {
    pub fn phases(&self) -> f64 {
        self.target_seconds + self.drafter_seconds + self.verify_seconds
    }
}

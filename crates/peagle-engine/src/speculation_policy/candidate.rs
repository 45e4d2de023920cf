//! One candidate k at one batch size and the estimate of its step time.

use std::collections::VecDeque;

use super::WINDOW;

#[derive(Debug, Clone)]
pub(super) struct Candidate {
    pub(super) k: usize,
    /// The last `WINDOW` timed steps, oldest first.
    pub(super) recent: VecDeque<f64>,
    /// The lower third of `recent`.
    pub(super) seconds: f64,
    /// Decision count (at this batch size) of the last measurement.
    pub(super) measured_at: u64,
}

impl Candidate {
    fn new(k: usize) -> Self {
        Self {
            k,
            recent: VecDeque::with_capacity(WINDOW),
            seconds: 0.0,
            measured_at: 0,
        }
    }

    /// Adds a timed step, taken at decision `decisions`, to the estimate.
    pub(super) fn record(&mut self, seconds: f64, decisions: u64) {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(seconds);
        let mut sorted: Vec<f64> = self.recent.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        self.seconds = sorted[(sorted.len() - 1) / 3];
        self.measured_at = decisions;
    }
}

/// Candidates for 0, 1, about K/2 and K drafts, timed in that order: a few points spanning the
/// cost curve keep the measuring cheap, and plain decoding timed first lets a hopeless window
/// stop early.
pub(super) fn candidates(max_k: usize) -> Vec<Candidate> {
    let mut ks = vec![0, 1, max_k.div_ceil(2), max_k];
    ks.dedup();
    ks.into_iter().map(Candidate::new).collect()
}

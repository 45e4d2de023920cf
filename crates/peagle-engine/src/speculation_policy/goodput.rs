//! What a candidate's measured step time is worth: goodput, and the score that picks the best.

use super::candidate::Candidate;
use super::HYSTERESIS;
use crate::spec_stats::SpecStats;

/// The inputs of one decision that turn a step time into tokens per second.
pub(super) struct Goodput<'a> {
    pub(super) batch: usize,
    pub(super) acceptance: &'a SpecStats,
    /// Seconds of drafter time on new prompts per token committed while drafting.
    pub(super) prompt_pass: f64,
}

impl Goodput<'_> {
    /// Tokens per second over the whole batch at the measured acceptance.
    pub(super) fn rate(&self, c: &Candidate) -> f64 {
        self.rate_at(c, self.acceptance.expected_tokens(c.k))
    }

    /// The rate with the hysteresis a k > 0 must overcome: the best candidate scores highest.
    pub(super) fn score(&self, c: &Candidate) -> f64 {
        self.score_at(c, self.acceptance.expected_tokens(c.k))
    }

    /// The score if every draft were accepted: what a window could at best do.
    pub(super) fn best_case(&self, c: &Candidate) -> f64 {
        self.score_at(c, (c.k + 1) as f64)
    }

    fn rate_at(&self, c: &Candidate, per_verification: f64) -> f64 {
        let tokens = self.batch as f64 * per_verification;
        let seconds = c.seconds.max(f64::MIN_POSITIVE);
        if c.k == 0 {
            tokens / seconds
        } else {
            tokens / (seconds + tokens * self.prompt_pass)
        }
    }

    fn score_at(&self, c: &Candidate, per_verification: f64) -> f64 {
        match c.k {
            0 => self.rate_at(c, per_verification),
            _ => self.rate_at(c, per_verification) / (1.0 + HYSTERESIS),
        }
    }
}

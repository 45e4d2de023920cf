//! How many drafts (k) to propose per sequence at a given decode batch size.
//!
//! At each batch size the policy runs the k it measured to give the most goodput. The
//! measurements behind each rule and constant are in `benches/results/speculation-policy.md`.
//!
//! **Goodput.** With k drafts at batch size B it is `B * expected_tokens(k) / seconds`, where
//! - `expected_tokens(k)` is what a verification of k drafts commits by the acceptance counts of
//!   every verification so far, at any batch size;
//! - `seconds` is the lower third (the 3rd fastest of 9) of the last `WINDOW` timed steps at B
//!   with k. A step is timed when it is decode-only and keeps the previous step's k, and, at
//!   k > 0, follows a step that did not wait for its drafter: a GPU runs a step's drafter
//!   while the host issues the next, so a steady step pays for the last step's drafter;
//! - for k > 0, `seconds` also pays the drafter's pass over new prompts: its time in prefill
//!   steps while drafting (the step after a switch left out, as it holds a catch-up), per token
//!   committed while drafting, times the tokens the step is expected to commit.
//!
//! A k > 0 scores its goodput divided by `1 + HYSTERESIS`, plain decoding (k = 0) its goodput;
//! the highest score is the best k.
//!
//! **Candidates** are 0, 1, ceil(K/2) and K, in that order. A batch size tries none above its
//! ceiling, the best k of the nearest smaller batch size that has one; a best k above the
//! ceiling is dropped and the batch size starts over.
//!
//! **Warm-up.** A batch size without a best k times each candidate for `WARMUP_STEPS` steps in
//! order, then reviews them: the best score becomes the best k. A window that, with every draft
//! accepted, would score below plain decoding (once that is warm) stops after `HOPELESS_STEPS`.
//!
//! **Re-measurement.** When the wait after a review is over, a challenger is timed against the
//! best k: both are timed afresh, one after the other, and the review that follows weighs only
//! those two. The challenger is plain decoding while the best k has not held against it in a
//! re-measurement since it was chosen, or when the best k degraded; otherwise it is the
//! candidate timed longest ago. With no other candidate, the wait starts again.
//!
//! The wait is `EXPLORE_EVERY` decisions at that batch size. Each re-measurement the best k
//! holds doubles it, up to `MAX_EXPLORE_EVERY`, and makes it at least long enough that the
//! re-measurement's regret (its decode-only steps' time beyond what the best k would have
//! needed for their tokens) is `EXPLORE_BUDGET` of the wait in the best k's steps. The wait does
//! not double while fewer than `MIN_EVIDENCE` verifications offered as many drafts as the
//! challenger proposes and the challenger would win with every draft accepted.
//!
//! **Degradation.** When the warm best k's goodput falls below `DEGRADED` of its goodput at the
//! last review, a re-measurement against plain decoding starts at once and the wait starts over.
//!
//! **New batch sizes** take the best k of the nearest batch size within an eighth of theirs (the
//! smaller on a tie), capped by their ceiling, and wait for a first re-measurement like any
//! other; with none near, they warm up.
//!
//! **Resuming.** After a step at k = 0, a k > 0 runs only at a batch size that has held for
//! `RESUME_AFTER` decisions in a row; before that the choice is 0.
//!
//! **Fixed k.** Not adaptive, or without a drafter (K = 0), the choice is always K.

mod batch_stats;
mod candidate;
mod goodput;
#[cfg(test)]
mod tests;

use crate::spec_stats::SpecStats;
use batch_stats::BatchStats;
use goodput::Goodput;

/// Timed steps a candidate needs before its estimate is trusted.
const WARMUP_STEPS: usize = 5;
/// Timed steps after which a window that loses to plain decoding even fully accepted stops.
const HOPELESS_STEPS: usize = 2;
/// Timed steps a candidate's estimate looks back on.
const WINDOW: usize = 9;
/// Decisions at one batch size between a review and the next re-measurement, before doubling.
const EXPLORE_EVERY: u64 = 64;
/// The most the wait between re-measurements grows to by doubling.
const MAX_EXPLORE_EVERY: u64 = 64 * EXPLORE_EVERY;
/// The largest share of the wait after it that a re-measurement's regret may take.
const EXPLORE_BUDGET: f64 = 0.02;
/// Verifications of a challenger's k drafts or more before its acceptance lets the wait double.
const MIN_EVIDENCE: u64 = 64;
/// Share of its goodput at the last review below which the best k has the others re-timed at once.
const DEGRADED: f64 = 0.5;
/// How much more goodput than plain decoding a k > 0 must show.
const HYSTERESIS: f64 = 0.15;
/// Decisions in a row at one batch size before drafting may resume there.
const RESUME_AFTER: usize = 8;

/// One engine step as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct StepSample {
    /// Sequences in the step.
    pub batch: usize,
    /// Drafts per sequence proposed in the step.
    pub k: usize,
    pub seconds: f64,
    /// False when the step also ran prefill work, whose cost says nothing about k, or left
    /// running sequences out (then it is not the batch size `choose` was asked about).
    pub decode_only: bool,
    /// The drafter's time in a step that ran prefill work (0 in other steps).
    pub prefill_drafter_seconds: f64,
    /// The step before waited for its own drafter (one with prefill work, at a new k or at
    /// k = 0), so this step's forward waited for no drafter work. A steady step at k > 0 waits
    /// for the last step's drafter, whose kernels a GPU runs while the host issues the step:
    /// at k > 0 this one is cheaper by a drafter pass, and is not timed.
    pub after_drafter_wait: bool,
    /// Tokens the step committed.
    pub tokens: usize,
}

#[derive(Debug, Clone)]
pub struct SpeculationPolicy {
    max_k: usize,
    adaptive: bool,
    /// Indexed by batch size - 1, grown on demand.
    by_batch: Vec<BatchStats>,
    /// The k of the previous step: the step after a change verifies the old k's drafts and
    /// proposes the new k's (after catching the drafter up), so it times neither.
    previous_k: Option<usize>,
    /// The batch size of the last decision and how many decisions in a row had it.
    last_batch: usize,
    held: usize,
    /// The drafter's time on new prompts while drafting, and the tokens committed while
    /// drafting, since the start.
    prompt_pass_seconds: f64,
    drafted_tokens: f64,
}

/// Every k a step can propose, ascending: the candidates when `adaptive`, else `max_k`; and 0,
/// at which a batch above `max_speculative_batch` runs. A step's windows verify the last
/// step's drafts, so each has k + 1 rows for one of these k (1 for a request that does not
/// speculate): the shapes CUDA graphs are captured for at start-up.
pub fn draft_counts(max_k: usize, adaptive: bool) -> Vec<usize> {
    // Without a drafter the policy chooses K = 0 alone, adaptive or not.
    let mut ks: Vec<usize> = match adaptive && max_k > 0 {
        true => candidate::candidates(max_k).iter().map(|c| c.k).collect(),
        false => vec![max_k],
    };
    ks.push(0);
    ks.sort_unstable();
    ks.dedup();
    ks
}

impl SpeculationPolicy {
    /// `adaptive` false always proposes `max_k` drafts.
    pub fn new(max_k: usize, adaptive: bool) -> Self {
        Self {
            max_k,
            adaptive,
            by_batch: Vec::new(),
            previous_k: None,
            last_batch: 0,
            held: 0,
            prompt_pass_seconds: 0.0,
            drafted_tokens: 0.0,
        }
    }

    /// The k of the last step observed.
    pub fn previous_k(&self) -> Option<usize> {
        self.previous_k
    }

    /// Drafts per sequence for a step whose drafts `batch` sequences will verify, given the
    /// acceptance measured so far.
    pub fn choose(&mut self, batch: usize, acceptance: &SpecStats) -> usize {
        if !self.adaptive || self.max_k == 0 {
            return self.max_k;
        }
        self.held = if batch == self.last_batch { self.held + 1 } else { 1 };
        self.last_batch = batch;
        let k = self.choose_at(batch, acceptance);
        let resumes = k > 0 && self.previous_k == Some(0);
        if resumes && self.held < RESUME_AFTER {
            0
        } else {
            k
        }
    }

    /// What the measurements at `batch` call for, before the wait for a held batch size.
    fn choose_at(&mut self, batch: usize, acceptance: &SpecStats) -> usize {
        let goodput = Goodput {
            batch,
            acceptance,
            prompt_pass: self.prompt_pass_per_token(),
        };
        let ceiling = self.ceiling(batch);
        let inherited = self.nearest_choice(batch);
        let stats = self.stats(batch);
        stats.start_decision(inherited, ceiling);
        let allowed = stats.allowed(ceiling);
        let timing = stats.timing(&allowed);
        if let Some(k) = stats.next_to_time(&timing, &goodput) {
            return k;
        }
        if !timing.is_empty() {
            stats.review(&timing, &goodput);
        }
        let best_k = stats.best_k.expect("reviewed above");
        let degraded = stats.degraded(best_k, &goodput);
        if degraded {
            stats.re_measure_now();
        }
        stats.re_measure_if_due(&allowed, best_k, degraded).unwrap_or(best_k)
    }

    /// Records what a step cost.
    pub fn observe(&mut self, step: StepSample) {
        let steady = self.previous_k == Some(step.k);
        self.previous_k = Some(step.k);
        let timed = steady && !(step.k > 0 && step.after_drafter_wait);
        if step.k > 0 {
            self.drafted_tokens += step.tokens as f64;
            // After a switch the drafter time also holds the catch-up, which is not a prompt's.
            if steady {
                self.prompt_pass_seconds += step.prefill_drafter_seconds;
            }
        }
        if self.adaptive && step.decode_only {
            self.stats(step.batch).observe(&step, timed);
        }
    }

    /// Seconds of drafter time on new prompts per token committed while drafting.
    fn prompt_pass_per_token(&self) -> f64 {
        if self.drafted_tokens == 0.0 {
            0.0
        } else {
            self.prompt_pass_seconds / self.drafted_tokens
        }
    }

    /// The best k of the nearest batch size within an eighth of `batch` that has one, the
    /// smaller on a tie. Small batches differ too much from their neighbours to inherit.
    fn nearest_choice(&self, batch: usize) -> Option<usize> {
        let index = batch.max(1) - 1;
        let distance = |i: usize| (i.abs_diff(index), i > index);
        (0..self.by_batch.len())
            .filter(|i| *i != index && i.abs_diff(index) <= batch / 8)
            .filter_map(|i| self.by_batch[i].best_k.map(|k| (distance(i), k)))
            .min_by_key(|(d, _)| *d)
            .map(|(_, k)| k)
    }

    /// The best k of the nearest smaller batch size that has one.
    fn ceiling(&self, batch: usize) -> usize {
        self.by_batch[..(batch.max(1) - 1).min(self.by_batch.len())]
            .iter()
            .rev()
            .find_map(|s| s.best_k)
            .unwrap_or(self.max_k)
    }

    fn stats(&mut self, batch: usize) -> &mut BatchStats {
        let index = batch.max(1) - 1;
        if self.by_batch.len() <= index {
            self.by_batch.resize(index + 1, BatchStats::new(self.max_k));
        }
        &mut self.by_batch[index]
    }
}

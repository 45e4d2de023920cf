//! The policy's state at one batch size and the steps of a decision there: warm-up, review,
//! and re-measurement of the best k against a challenger.

use super::candidate::{candidates, Candidate};
use super::goodput::Goodput;
use super::{
    StepSample, DEGRADED, EXPLORE_BUDGET, EXPLORE_EVERY, HOPELESS_STEPS, MAX_EXPLORE_EVERY, MIN_EVIDENCE, WARMUP_STEPS,
};

/// A running re-measurement: a challenger timed against the incumbent.
#[derive(Debug, Clone)]
struct Exploration {
    /// The best k when it started.
    incumbent_k: usize,
    /// Index of the candidate timed against it.
    challenger: usize,
    /// Seconds its steps took beyond what the incumbent would have needed for their tokens,
    /// the catch-up that resuming drafting costs included.
    regret: f64,
}

#[derive(Debug, Clone)]
pub(super) struct BatchStats {
    pub(super) candidates: Vec<Candidate>,
    decisions: u64,
    /// The best k once every candidate this batch size tries is timed, or as inherited from
    /// the nearest batch size with one.
    pub(super) best_k: Option<usize>,
    /// Decision count at which the next re-measurement starts, and the wait after it.
    next_explore: u64,
    explore_gap: u64,
    exploring: Option<Exploration>,
    /// The best k's goodput at the last review, in tokens per second (0 before one).
    reviewed_rate: f64,
    /// Whether the best k held against plain decoding in a re-measurement since it was chosen.
    held_against_plain: bool,
}

impl BatchStats {
    pub(super) fn new(max_k: usize) -> Self {
        Self {
            candidates: candidates(max_k),
            decisions: 0,
            best_k: None,
            next_explore: EXPLORE_EVERY,
            explore_gap: EXPLORE_EVERY,
            exploring: None,
            reviewed_rate: 0.0,
            held_against_plain: false,
        }
    }

    /// Counts a decision. The first one at this batch size takes `inherited`, the choice of a
    /// batch size near it, as the best k; any above `ceiling` is dropped.
    pub(super) fn start_decision(&mut self, inherited: Option<usize>, ceiling: usize) {
        if self.decisions == 0 {
            self.best_k = inherited.map(|k| k.min(ceiling));
        }
        self.decisions += 1;
        if self.best_k.is_some_and(|k| k > ceiling) {
            // A smaller batch size now drafts less: start over below its choice.
            self.best_k = None;
            self.exploring = None;
        }
    }

    /// Indices of the candidates this batch size may try: none above `ceiling`.
    pub(super) fn allowed(&self, ceiling: usize) -> Vec<usize> {
        (0..self.candidates.len())
            .filter(|i| self.candidates[*i].k <= ceiling)
            .collect()
    }

    /// Indices of the candidates to time now: all at first, the two of a re-measurement later.
    pub(super) fn timing(&self, allowed: &[usize]) -> Vec<usize> {
        match (&self.exploring, self.best_k) {
            (Some(e), _) => allowed
                .iter()
                .copied()
                .filter(|i| *i == e.challenger || self.candidates[*i].k == e.incumbent_k)
                .collect(),
            (None, None) => allowed.to_vec(),
            (None, Some(_)) => Vec::new(),
        }
    }

    /// The k of the first candidate in `timing` that still needs timed steps.
    pub(super) fn next_to_time(&self, timing: &[usize], goodput: &Goodput) -> Option<usize> {
        // Plain decoding, once timed alongside (it is timed first): a window whose steps make it
        // lose to that even with every draft accepted needs no more of them.
        let plain = timing
            .iter()
            .map(|i| &self.candidates[*i])
            .find(|c| c.k == 0 && c.recent.len() >= WARMUP_STEPS);
        let hopeless = |c: &Candidate| {
            plain
                .is_some_and(|p| c.k > 0 && c.recent.len() >= HOPELESS_STEPS && goodput.best_case(c) < goodput.score(p))
        };
        timing
            .iter()
            .map(|i| &self.candidates[*i])
            .find(|c| c.recent.len() < WARMUP_STEPS && !hopeless(c))
            .map(|c| c.k)
    }

    /// Makes the best scoring of `timing`, all freshly timed, the best k, and sets the wait for
    /// the next re-measurement. Step times follow the context length (a long prompt makes every
    /// step slower), so only candidates timed side by side compete: one timed during another
    /// request would win or lose for nothing it does.
    pub(super) fn review(&mut self, timing: &[usize], goodput: &Goodput) {
        let best = timing
            .iter()
            .copied()
            .max_by(|a, b| {
                goodput
                    .score(&self.candidates[*a])
                    .total_cmp(&goodput.score(&self.candidates[*b]))
            })
            .expect("not empty");
        let best_k = self.candidates[best].k;
        self.explore_gap = match self.exploring.take() {
            Some(e) if e.incumbent_k == best_k => self.wait_after_holding(&e, best, goodput),
            _ => EXPLORE_EVERY,
        };
        self.next_explore = self.decisions + self.explore_gap;
        let changed = self.best_k != Some(best_k);
        let plain_timed = timing.iter().any(|i| self.candidates[*i].k == 0);
        self.held_against_plain = !changed && (self.held_against_plain || plain_timed);
        self.log_review(timing, goodput, best_k, changed);
        self.best_k = Some(best_k);
        self.reviewed_rate = goodput.rate(&self.candidates[best]);
    }

    /// The wait after the incumbent, candidate `best`, held against the challenger of `e`:
    /// doubled up to `MAX_EXPLORE_EVERY`, and long enough that what the re-measurement cost is
    /// at most `EXPLORE_BUDGET` of it.
    fn wait_after_holding(&self, e: &Exploration, best: usize, goodput: &Goodput) -> u64 {
        let incumbent = &self.candidates[best];
        let step = incumbent.seconds.max(f64::MIN_POSITIVE);
        let paid_off = (e.regret.max(0.0) / (EXPLORE_BUDGET * step)).ceil() as u64;
        // A challenger's acceptance rests on few verifications at first, and an early low
        // estimate must not keep drafting off for good; unless it would lose even with every
        // draft accepted.
        let challenger = &self.candidates[e.challenger];
        let evidence = match challenger.k {
            0 => u64::MAX,
            k => goodput.acceptance.offered_per_position.get(k - 1).copied().unwrap_or(0),
        };
        let could_win = goodput.best_case(challenger) > goodput.score(incumbent);
        let unsure = evidence < MIN_EVIDENCE && could_win;
        let grown = if unsure { EXPLORE_EVERY } else { 2 * self.explore_gap };
        grown.min(MAX_EXPLORE_EVERY).max(paid_off)
    }

    /// Logs a review at debug level with each candidate's numbers: the ones that explain why a
    /// k loses.
    fn log_review(&self, timing: &[usize], goodput: &Goodput, best_k: usize, changed: bool) {
        // (k, tokens per verification, step ms, score in tokens/s)
        let round2 = |x: f64| (x * 100.0).round() / 100.0;
        let scores: Vec<(usize, f64, f64, f64)> = timing
            .iter()
            .map(|i| {
                let c = &self.candidates[*i];
                (
                    c.k,
                    round2(goodput.acceptance.expected_tokens(c.k)),
                    round2(c.seconds * 1e3),
                    goodput.score(c).round(),
                )
            })
            .collect();
        tracing::debug!(
            batch = goodput.batch,
            k = best_k,
            changed,
            next_in = self.explore_gap,
            prompt_pass_us_per_token = (goodput.prompt_pass * 1e6).round(),
            ?scores,
            "speculation policy review"
        );
    }

    /// Whether the best k, fully timed, fell below `DEGRADED` of its goodput at the last review.
    pub(super) fn degraded(&self, best_k: usize, goodput: &Goodput) -> bool {
        let incumbent = self.candidates.iter().find(|c| c.k == best_k).expect("a candidate");
        incumbent.recent.len() >= WARMUP_STEPS && goodput.rate(incumbent) < DEGRADED * self.reviewed_rate
    }

    /// Makes the next re-measurement due now, its wait starting over.
    pub(super) fn re_measure_now(&mut self) {
        self.explore_gap = EXPLORE_EVERY;
        self.next_explore = self.decisions;
    }

    /// Starts the re-measurement of `best_k` when one is due, and returns the k to time first;
    /// with no challenger, waits another gap.
    pub(super) fn re_measure_if_due(&mut self, allowed: &[usize], best_k: usize, degraded: bool) -> Option<usize> {
        if self.decisions < self.next_explore {
            return None;
        }
        let Some(challenger) = self.challenger(allowed, best_k, degraded) else {
            self.next_explore = self.decisions + self.explore_gap;
            return None;
        };
        // The challenger and the incumbent are timed afresh, one right after the other, like a
        // warm-up; the review follows.
        let challenger_k = self.candidates[challenger].k;
        for c in self
            .candidates
            .iter_mut()
            .filter(|c| c.k == best_k || c.k == challenger_k)
        {
            c.recent.clear();
        }
        self.exploring = Some(Exploration {
            incumbent_k: best_k,
            challenger,
            regret: 0.0,
        });
        let first = allowed
            .iter()
            .find(|i| self.candidates[**i].recent.is_empty())
            .expect("the challenger was just cleared");
        Some(self.candidates[*first].k)
    }

    /// The candidate to time against `best_k`. A window that got much worse is held against
    /// plain decoding first, which cannot lose to itself, and so is a window newly chosen: the
    /// review that chose it may have timed plain decoding in a burst of slow steps, and a window
    /// re-timed against other windows only would keep drafting on where it loses. Otherwise the
    /// candidate timed longest ago is next.
    fn challenger(&self, allowed: &[usize], best_k: usize, degraded: bool) -> Option<usize> {
        let others = || allowed.iter().copied().filter(|i| self.candidates[*i].k != best_k);
        let against_plain = degraded || !self.held_against_plain;
        others()
            .find(|i| against_plain && self.candidates[*i].k == 0)
            .or_else(|| others().min_by_key(|i| self.candidates[*i].measured_at))
    }

    /// Records a decode-only step: its regret while re-measuring, and its time for its k when
    /// `timed` (`SpeculationPolicy::observe` says which steps are).
    pub(super) fn observe(&mut self, step: &StepSample, timed: bool) {
        let reviewed_rate = self.reviewed_rate;
        if let Some(e) = self.exploring.as_mut().filter(|_| reviewed_rate > 0.0) {
            e.regret += step.seconds - step.tokens as f64 / reviewed_rate;
        }
        if !timed {
            return;
        }
        if let Some(c) = self.candidates.iter_mut().find(|c| c.k == step.k) {
            c.record(step.seconds, self.decisions);
        }
    }
}

//! How many drafts to propose at a given decode batch size.
//!
//! A verification window costs k + 1 target rows per sequence, so drafting pays while the
//! target is bound by reading its weights and loses once it is bound by arithmetic. Where that
//! turns depends on the device, both models and the acceptance rate, so the policy measures it
//! instead of guessing. Goodput with k drafts at batch size B is
//! `B * expected_tokens(k) / step_seconds(B, k)`:
//! - `expected_tokens` comes from the acceptance counts of every verification so far (they do
//!   not depend on the batch size, and pooling them keeps the estimate steady);
//! - `step_seconds` is the lower third of the last few decode-only steps per batch size and
//!   candidate k, k = 0 (plain decoding) included: the 3rd fastest of 9. On a shared host a
//!   step now and then takes several times as long, whatever its k. In a mean those strays
//!   flipped the choice back and forth (and each flip to drafting cost a catch-up and steps of
//!   a losing k); a median still flipped when a window happened to hold five of them. Strays
//!   only ever slow a step down, so a low quantile measures what the k itself costs.
//!
//! Speculating also costs what decode-only steps do not show:
//! - The drafter's pass over each new prompt. It runs in prefill steps, which are not timed
//!   (their cost is mostly the prompt's), so it is measured on its own: the drafter time of
//!   steps that ran prefill while drafting, per token committed while drafting, is added to
//!   every k > 0. (It slightly over-counts: the decoding sequences of such a step draft too.)
//! - The catch-up pass when drafting resumes after a pause: the drafter reads every target state
//!   it skipped. It is the price of each switch from k = 0, so drafting resumes only at a batch
//!   size that has held for `RESUME_AFTER` decisions. A batch that dips for a step or two (one
//!   request finished, the next is on its way) would otherwise switch drafting on for that
//!   step: under steady load at batch 4 such catch-ups took 8% of the engine's time, and made
//!   speculation lose to plain decoding although plain decoding was the choice at batch 4.
//!
//! A k > 0 must still beat plain decoding by `HYSTERESIS`. On a shared host the estimates are
//! noisy: at batch 16 one k = 1 window timed 16 ms in its lower third and 20 ms on average a
//! minute later, enough to pick drafting where it lost 15%. The hysteresis also keeps two nearly
//! equal candidates from swapping, each swap to drafting costing a catch-up. (Counting every
//! step, prefill included, was tried instead of this accounting: prefill steps made the
//! averages too noisy to choose by.)
//!
//! Each candidate is timed a few steps in a row, plain decoding first, then the best runs, and
//! now and then the longest-unmeasured other candidate is timed again, so the choice follows
//! changes in context length and load. A window whose first two steps show it would lose to
//! plain decoding even with every draft accepted is not timed further: a server started under
//! load (batch 16) spent a tenth of its first 64 requests timing P-EAGLE windows of 7 drafts,
//! each step 9 times a plain one. Re-timing is not free: its steps run a losing k, and turning
//! drafting back on first catches the drafter up on every running sequence, which for a 4-layer
//! drafter at batch 16 took as long as 60 plain steps. So each time it confirms the incumbent
//! the wait before the next one doubles, from `EXPLORE_EVERY` up to `MAX_EXPLORE_EVERY` steps
//! at that batch size, and is at least long enough that what the re-measurement cost (its
//! steps' time beyond what the incumbent would have taken for their tokens) is `EXPLORE_BUDGET`
//! of the time in between. The wait does not grow while the challenger has fewer than
//! `MIN_EVIDENCE` verifications behind its acceptance, unless it would lose even with every
//! draft accepted: with EAGLE-3 at batch 1 the first review saw 1.89 tokens per verification of
//! k = 3 where the steady state gives 3.1 (a first request's opening tokens are harder to
//! draft), and doubling waits on that estimate kept drafting off for 8,000 steps of a 1.3x
//! gain. A re-measurement times the challenger and then the incumbent afresh, one right after
//! the other, and the review weighs only those two: step times follow the context length, so
//! numbers from another request say little. A newly chosen k > 0 meets plain decoding at its
//! first re-measurement, before any other k: the review that chose it may have timed plain
//! decoding in a burst of slow steps, and held only against other windows it kept drafting on
//! where it lost. When the incumbent's own goodput falls to half of
//! what it was, the others are re-timed at once, plain decoding first. Drafting only gets less
//! worthwhile as the batch grows, so a batch size does not try a k above the best one of the
//! nearest smaller batch size: a ramp-up does not time long windows at every size again. And a
//! batch size new to the policy starts from the choice of a known one within an eighth of it,
//! waiting for its first re-measurement like any other: as a wave of 16 requests drains, batch
//! 15, 14, ... each hold for a few dozen steps, and warming each up would catch the drafter up
//! for nothing.

use std::collections::VecDeque;

use crate::spec_stats::SpecStats;

/// Timed steps a candidate needs before the policy trusts its estimate.
const WARMUP_STEPS: usize = 5;
/// Timed steps after which a window that loses to plain decoding even with every draft
/// accepted stops being timed. Two, because a stray slow step now and then would otherwise
/// end a candidate that could win; at batch 16 a P-EAGLE window of 7 took 9 times a plain step,
/// and its warm-up cost a tenth of a 64-request run.
const HOPELESS_STEPS: usize = 2;
/// Steps a candidate's estimate looks back on: recent enough to follow context growth.
const WINDOW: usize = 9;
/// Steps before the first re-measurement of the candidates that are not the best.
const EXPLORE_EVERY: u64 = 64;
/// The longest wait between re-measurements.
const MAX_EXPLORE_EVERY: u64 = 64 * EXPLORE_EVERY;
/// The most of the engine's time re-measurements may cost: a re-measurement that took its
/// steps this share of the time since the last one waits longer for the next.
const EXPLORE_BUDGET: f64 = 0.02;
/// Verifications that offered a window before its acceptance estimate is trusted enough to
/// let the wait between re-measurements grow.
const MIN_EVIDENCE: u64 = 64;
/// Below this share of its goodput at the last review, the best k has the others re-timed at
/// once. Low, because every k slows down alike as contexts grow (a step at 500 tokens of
/// context costs 1.5x one at 20 here), and that alone is no reason to re-time.
const DEGRADED: f64 = 0.5;
/// How much more goodput than plain decoding a k > 0 must show: estimates of one candidate
/// taken a minute apart differ by 10 to 20% on a shared host.
const HYSTERESIS: f64 = 0.15;
/// Decisions at one batch size in a row before drafting may resume there.
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
    /// Tokens the step committed.
    pub tokens: usize,
}

#[derive(Debug, Clone)]
struct Candidate {
    k: usize,
    /// The last `WINDOW` timed steps, oldest first.
    recent: VecDeque<f64>,
    /// The lower third of `recent`.
    seconds: f64,
    /// Decision count (at this batch size) of the last measurement.
    measured_at: u64,
}

impl Candidate {
    fn record(&mut self, seconds: f64) {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(seconds);
        let mut sorted: Vec<f64> = self.recent.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        self.seconds = sorted[(sorted.len() - 1) / 3];
    }
}

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
struct BatchStats {
    candidates: Vec<Candidate>,
    decisions: u64,
    /// The best k once every candidate this batch size tries is timed, or as inherited from
    /// the nearest batch size with one.
    best_k: Option<usize>,
    /// Decision count at which the next re-measurement starts, and the wait after it.
    next_explore: u64,
    explore_gap: u64,
    exploring: Option<Exploration>,
    /// The best k's goodput at the last review, in tokens per second (0 before one).
    reviewed_rate: f64,
    /// Whether the best k held against plain decoding in a re-measurement since it was chosen.
    held_against_plain: bool,
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
        let prompt_pass = self.prompt_pass_per_token();
        let ceiling = self.ceiling(batch);
        let inherited = self.nearest_choice(batch);
        let stats = self.stats(batch);
        if stats.decisions == 0 {
            stats.best_k = inherited.map(|k| k.min(ceiling));
        }
        stats.decisions += 1;
        if stats.best_k.is_some_and(|k| k > ceiling) {
            // A smaller batch size now drafts less: start over below its choice.
            stats.best_k = None;
            stats.exploring = None;
        }
        let allowed: Vec<usize> = (0..stats.candidates.len())
            .filter(|i| stats.candidates[*i].k <= ceiling)
            .collect();
        // Candidates to time now: all at first, the two of a re-measurement later.
        let timing: Vec<usize> = match (&stats.exploring, stats.best_k) {
            (Some(e), _) => allowed
                .iter()
                .copied()
                .filter(|i| *i == e.challenger || stats.candidates[*i].k == e.incumbent_k)
                .collect(),
            (None, None) => allowed.clone(),
            (None, Some(_)) => Vec::new(),
        };
        // Tokens per second over the whole batch at a given number of tokens per verification,
        // and the score that picks the best.
        let rate_at = |c: &Candidate, per_verification: f64| {
            let tokens = batch as f64 * per_verification;
            let seconds = c.seconds.max(f64::MIN_POSITIVE);
            if c.k == 0 {
                tokens / seconds
            } else {
                tokens / (seconds + tokens * prompt_pass)
            }
        };
        let score_at = |c: &Candidate, per_verification: f64| match c.k {
            0 => rate_at(c, per_verification),
            _ => rate_at(c, per_verification) / (1.0 + HYSTERESIS),
        };
        let rate = |c: &Candidate| rate_at(c, acceptance.expected_tokens(c.k));
        let score = |c: &Candidate| score_at(c, acceptance.expected_tokens(c.k));
        // The score if every draft were accepted: what a window could at best do.
        let best_case = |c: &Candidate| score_at(c, (c.k + 1) as f64);
        // Plain decoding, once timed alongside (it is timed first): a window whose steps make it
        // lose to that even with every draft accepted needs no more of them.
        let plain = timing
            .iter()
            .map(|i| &stats.candidates[*i])
            .find(|c| c.k == 0 && c.recent.len() >= WARMUP_STEPS);
        let hopeless = |c: &Candidate| {
            plain.is_some_and(|p| c.k > 0 && c.recent.len() >= HOPELESS_STEPS && best_case(c) < score(p))
        };
        if let Some(&untimed) = timing.iter().find(|i| {
            let c = &stats.candidates[**i];
            c.recent.len() < WARMUP_STEPS && !hopeless(c)
        }) {
            return stats.candidates[untimed].k;
        }
        // The choice is reviewed on fresh numbers only: after warm-up, or once a re-measurement
        // has timed a challenger and the incumbent again. Step times follow the context length
        // (a long prompt makes every step slower), so after a re-measurement only those two,
        // timed side by side, compete: a candidate timed during another request would win or
        // lose for nothing it does.
        if !timing.is_empty() {
            let best = timing
                .iter()
                .copied()
                .max_by(|a, b| score(&stats.candidates[*a]).total_cmp(&score(&stats.candidates[*b])))
                .expect("not empty");
            let best_k = stats.candidates[best].k;
            stats.explore_gap = match stats.exploring.take() {
                Some(e) if e.incumbent_k == best_k => {
                    // Re-measuring pays off less the more it costs: wait until what this one
                    // cost is at most `EXPLORE_BUDGET` of the time in between.
                    let step = stats.candidates[best].seconds.max(f64::MIN_POSITIVE);
                    let paid_off = (e.regret.max(0.0) / (EXPLORE_BUDGET * step)).ceil() as u64;
                    // A challenger's acceptance rests on few verifications at first, and an
                    // early low estimate must not keep drafting off for good; unless it would
                    // lose even with every draft accepted.
                    let challenger = &stats.candidates[e.challenger];
                    let evidence = match challenger.k {
                        0 => u64::MAX,
                        k => acceptance.offered_per_position.get(k - 1).copied().unwrap_or(0),
                    };
                    let could_win = best_case(challenger) > score(&stats.candidates[best]);
                    let unsure = evidence < MIN_EVIDENCE && could_win;
                    let grown = if unsure { EXPLORE_EVERY } else { 2 * stats.explore_gap };
                    grown.min(MAX_EXPLORE_EVERY).max(paid_off)
                }
                _ => EXPLORE_EVERY,
            };
            stats.next_explore = stats.decisions + stats.explore_gap;
            // (k, tokens per verification, step ms, score in tokens/s)
            let round2 = |x: f64| (x * 100.0).round() / 100.0;
            let scores: Vec<(usize, f64, f64, f64)> = timing
                .iter()
                .map(|i| {
                    let c = &stats.candidates[*i];
                    (
                        c.k,
                        round2(acceptance.expected_tokens(c.k)),
                        round2(c.seconds * 1e3),
                        score(c).round(),
                    )
                })
                .collect();
            let changed = stats.best_k != Some(best_k);
            let plain_timed = timing.iter().any(|i| stats.candidates[*i].k == 0);
            stats.held_against_plain = !changed && (stats.held_against_plain || plain_timed);
            tracing::debug!(
                batch,
                k = best_k,
                changed,
                next_in = stats.explore_gap,
                prompt_pass_us_per_token = (prompt_pass * 1e6).round(),
                ?scores,
                "speculation policy review"
            );
            stats.best_k = Some(best_k);
            stats.reviewed_rate = rate(&stats.candidates[best]);
        }
        let best_k = stats.best_k.expect("reviewed above");
        let incumbent = stats.candidates.iter().find(|c| c.k == best_k).expect("a candidate");
        let degraded = incumbent.recent.len() >= WARMUP_STEPS && rate(incumbent) < DEGRADED * stats.reviewed_rate;
        if degraded {
            // The choice got much worse since it was made: re-time the others now.
            stats.explore_gap = EXPLORE_EVERY;
            stats.next_explore = stats.decisions;
        }
        if stats.decisions >= stats.next_explore {
            let others = || allowed.iter().copied().filter(|i| stats.candidates[*i].k != best_k);
            // A window that got much worse is held against plain decoding first, which cannot
            // lose to itself, and so is a window newly chosen: the review that chose it may have
            // timed plain decoding in a burst of slow steps, and a window re-timed against other
            // windows only would keep drafting on where it loses. Otherwise the candidate timed
            // longest ago is next.
            let against_plain = degraded || !stats.held_against_plain;
            let stale = others()
                .find(|i| against_plain && stats.candidates[*i].k == 0)
                .or_else(|| others().min_by_key(|i| stats.candidates[*i].measured_at));
            if let Some(challenger) = stale {
                // The challenger and the incumbent are timed afresh, one right after the
                // other, like a warm-up; the review follows.
                let challenger_k = stats.candidates[challenger].k;
                for c in stats
                    .candidates
                    .iter_mut()
                    .filter(|c| c.k == best_k || c.k == challenger_k)
                {
                    c.recent.clear();
                }
                stats.exploring = Some(Exploration {
                    incumbent_k: best_k,
                    challenger,
                    regret: 0.0,
                });
                let first = allowed
                    .iter()
                    .find(|i| stats.candidates[**i].recent.is_empty())
                    .expect("the challenger was just cleared");
                return stats.candidates[*first].k;
            }
            stats.next_explore = stats.decisions + stats.explore_gap;
        }
        best_k
    }

    /// Records what a step cost.
    pub fn observe(&mut self, step: StepSample) {
        let steady = self.previous_k == Some(step.k);
        self.previous_k = Some(step.k);
        if step.k > 0 {
            self.drafted_tokens += step.tokens as f64;
            // After a switch the drafter time also holds the catch-up, which is not a prompt's.
            if steady {
                self.prompt_pass_seconds += step.prefill_drafter_seconds;
            }
        }
        if !self.adaptive || !step.decode_only {
            return;
        }
        let stats = self.stats(step.batch);
        if let Some(e) = stats.exploring.as_mut().filter(|_| stats.reviewed_rate > 0.0) {
            e.regret += step.seconds - step.tokens as f64 / stats.reviewed_rate;
        }
        if !steady {
            return;
        }
        let decisions = stats.decisions;
        let Some(i) = stats.candidates.iter().position(|c| c.k == step.k) else {
            return;
        };
        let c = &mut stats.candidates[i];
        c.record(step.seconds);
        c.measured_at = decisions;
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
            let template = BatchStats {
                candidates: candidate_ks(self.max_k)
                    .into_iter()
                    .map(|k| Candidate {
                        k,
                        recent: VecDeque::with_capacity(WINDOW),
                        seconds: 0.0,
                        measured_at: 0,
                    })
                    .collect(),
                decisions: 0,
                best_k: None,
                next_explore: EXPLORE_EVERY,
                explore_gap: EXPLORE_EVERY,
                exploring: None,
                reviewed_rate: 0.0,
                held_against_plain: false,
            };
            self.by_batch.resize(index + 1, template);
        }
        &mut self.by_batch[index]
    }
}

/// 0, 1, about K/2 and K, timed in that order: a few points spanning the cost curve keep the
/// measuring cheap, and plain decoding timed first lets a hopeless window stop early.
fn candidate_ks(max_k: usize) -> Vec<usize> {
    let mut ks = vec![0, 1, max_k.div_ceil(2), max_k];
    ks.dedup();
    ks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Acceptance over 1000 verifications where each draft position is accepted with
    /// probability `p` given the ones before were.
    fn acceptance(p: f64, k: usize) -> SpecStats {
        acceptance_over(p, k, 1000)
    }

    fn acceptance_over(p: f64, k: usize, verifications: usize) -> SpecStats {
        let mut s = SpecStats::default();
        let mut reached = verifications as f64;
        for accepted in 0..=k {
            let stop = if accepted == k { reached } else { reached * (1.0 - p) };
            for _ in 0..stop.round() as usize {
                s.record(k, accepted);
            }
            reached -= stop;
        }
        s
    }

    /// Runs `steps` decode steps at `batch`, where a step with k drafts takes `seconds(k)`.
    fn drive(
        p: &mut SpeculationPolicy,
        batch: usize,
        steps: usize,
        acceptance: &SpecStats,
        mut seconds: impl FnMut(usize) -> f64,
    ) -> Vec<usize> {
        drive_steps(p, batch, steps, acceptance, |_, k| {
            decode_step(batch, k, seconds(k), acceptance)
        })
    }

    /// Runs `steps` steps at `batch`; `sample(step, k)` says what step number `step` with k
    /// drafts cost.
    fn drive_steps(
        p: &mut SpeculationPolicy,
        batch: usize,
        steps: usize,
        acceptance: &SpecStats,
        mut sample: impl FnMut(usize, usize) -> StepSample,
    ) -> Vec<usize> {
        (0..steps)
            .map(|step| {
                let k = p.choose(batch, acceptance);
                p.observe(sample(step, k));
                k
            })
            .collect()
    }

    /// A decode-only step with k drafts that took `seconds` and committed what `acceptance`
    /// expects.
    fn decode_step(batch: usize, k: usize, seconds: f64, acceptance: &SpecStats) -> StepSample {
        StepSample {
            batch,
            k,
            seconds,
            decode_only: true,
            prefill_drafter_seconds: 0.0,
            tokens: batch * acceptance.expected_tokens(k).round() as usize,
        }
    }

    /// How many of `ks` are `k`.
    fn share(ks: &[usize], k: usize) -> f64 {
        ks.iter().filter(|x| **x == k).count() as f64 / ks.len() as f64
    }

    #[test]
    fn picks_the_fastest_k_per_batch_size() {
        let good = acceptance(0.8, 7);
        let mut p = SpeculationPolicy::new(7, true);
        // Alone, a window costs little more than one row; at batch 8 every row costs in full.
        let alone = drive(&mut p, 1, 200, &good, |k| 1.0 + 0.05 * k as f64);
        let loaded = drive(&mut p, 8, 200, &good, |k| 8.0 * (k + 1) as f64);
        assert!(share(&alone[20..], 7) > 0.9, "{alone:?}");
        assert!(share(&loaded[20..], 0) > 0.9, "{loaded:?}");
        for k in [0, 1, 4, 7] {
            assert!(alone.contains(&k), "{k} never timed in {alone:?}");
        }
    }

    #[test]
    fn poor_acceptance_turns_speculation_off() {
        let mut p = SpeculationPolicy::new(3, true);
        let ks = drive(&mut p, 1, 200, &acceptance(0.05, 3), |k| 1.0 + 0.2 * k as f64);
        assert!(share(&ks[20..], 0) > 0.9, "{ks:?}");
    }

    #[test]
    fn re_measures_and_follows_a_change_in_cost() {
        let good = acceptance(0.7, 3);
        let mut p = SpeculationPolicy::new(3, true);
        drive(&mut p, 2, 100, &good, |k| 1.0 + 0.1 * k as f64);
        // The windows get expensive (longer contexts, say): plain decoding now wins.
        let after = drive(&mut p, 2, 1000, &good, |k| 1.0 + 2.0 * k as f64);
        assert!(share(&after[100..], 0) > 0.9, "{after:?}");
        assert!(
            share(&after[100..], 0) < 1.0,
            "the other candidates must be re-timed now and then"
        );
    }

    #[test]
    fn re_measures_less_often_while_the_choice_holds() {
        let good = acceptance(0.8, 3);
        let mut p = SpeculationPolicy::new(3, true);
        let ks = drive(&mut p, 4, 8000, &good, |k| 1.0 + k as f64);
        let retimed = |range: std::ops::Range<usize>| ks[range].iter().filter(|k| **k != 0).count();
        let (early, late) = (retimed(100..2100), retimed(6000..8000));
        assert!(early > 0 && late < early, "re-timing steps: {early} early, {late} late");
    }

    #[test]
    fn speculation_must_win_by_the_hysteresis() {
        // Three drafts give 3.7 tokens a step for 3.36x the step time: 10% ahead, not 15%.
        let mut p = SpeculationPolicy::new(3, true);
        let ks = drive(
            &mut p,
            1,
            300,
            &acceptance(0.95, 3),
            |k| if k == 0 { 1.0 } else { 3.36 },
        );
        assert!(share(&ks[50..], 0) > 0.9, "{ks:?}");
    }

    #[test]
    fn the_drafters_prompt_passes_count_against_drafting() {
        // Three drafts give 2.95 tokens a step for 2.2x the step time: 34% ahead in decode-only
        // steps. A new prompt arrives every 20 steps; a costly drafter pass over it (12 steps'
        // worth, about 0.2 per token drafted) turns that into a loss.
        let good = acceptance(0.8, 3);
        for (pass_seconds, drafting_wins) in [(0.0, true), (12.0, false)] {
            let mut p = SpeculationPolicy::new(3, true);
            let ks = drive_steps(&mut p, 1, 1000, &good, |step, k| {
                let new_prompt = step % 20 == 0;
                StepSample {
                    decode_only: !new_prompt,
                    prefill_drafter_seconds: if new_prompt && k > 0 { pass_seconds } else { 0.0 },
                    ..decode_step(1, k, 1.0 + 0.4 * k as f64, &good)
                }
            });
            let drafted = 1.0 - share(&ks[200..], 0);
            assert_eq!(
                drafted > 0.9,
                drafting_wins,
                "drafted {drafted:.3} with {pass_seconds} s passes"
            );
        }
    }

    #[test]
    fn a_batch_that_dips_for_a_step_does_not_resume_drafting() {
        // Drafting wins at batch 3 and loses at batch 4. Under steady load a finished request
        // leaves batch 3 for a step until the next one arrives: resuming drafting for that
        // step would cost a catch-up for nothing.
        let good = acceptance(0.8, 3);
        let cost = |batch: usize| {
            move |k: usize| {
                if batch == 3 {
                    1.0 + 0.1 * k as f64
                } else {
                    1.0 + k as f64
                }
            }
        };
        let mut p = SpeculationPolicy::new(3, true);
        drive(&mut p, 3, 200, &good, cost(3));
        drive(&mut p, 4, 200, &good, cost(4));
        let mut previous = *drive(&mut p, 4, 1, &good, cost(4)).last().expect("a step");
        for _ in 0..30 {
            let dip = drive(&mut p, 3, 1, &good, cost(3))[0];
            assert!(previous > 0 || dip == 0, "drafting resumed for a one-step dip");
            previous = *drive(&mut p, 4, 20, &good, cost(4)).last().expect("20 steps");
        }
        let held = drive(&mut p, 3, 50, &good, cost(3));
        assert!(share(&held[RESUME_AFTER..], 0) < 0.1, "{held:?}");
    }

    #[test]
    fn stray_slow_steps_do_not_flip_the_choice() {
        // A weak drafter: one draft gives 1.35 tokens for 1.3x the step time, so plain decoding
        // wins. One step in six is three times slower (the host doing something else).
        let mut p = SpeculationPolicy::new(3, true);
        let mut state = 12345u64;
        let ks = drive(&mut p, 1, 3000, &acceptance(0.35, 3), |k| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let hiccup = if (state >> 33).is_multiple_of(6) { 3.0 } else { 1.0 };
            hiccup * if k == 0 { 1.0 } else { 1.3 + 0.3 * k as f64 }
        });
        assert!(
            share(&ks[100..], 0) > 0.95,
            "drafted {:.3} of the steps",
            1.0 - share(&ks[100..], 0)
        );
    }

    #[test]
    fn a_switch_that_a_burst_of_slow_steps_caused_is_undone_against_plain_decoding() {
        // Drafting loses at batch 4 (3 drafts: 2.95 tokens for 3.4x the step time). Fifteen
        // steps run three times slower (the host busy elsewhere): plain decoding degrades, is
        // re-timed inside the burst and loses its review to a window timed after it.
        let good = acceptance(0.8, 5);
        let mut p = SpeculationPolicy::new(5, true);
        let burst = 500..515;
        let ks = drive_steps(&mut p, 4, 3000, &good, |step, k| {
            let slow = if burst.contains(&step) { 3.0 } else { 1.0 };
            decode_step(4, k, slow * (1.0 + 0.8 * k as f64), &good)
        });
        let drafted = |range: std::ops::Range<usize>| 1.0 - share(&ks[range], 0);
        assert!(drafted(100..500) < 0.05, "{:?}", &ks[100..500]);
        // The window that won is held against plain decoding at its first re-measurement.
        assert!(drafted(515..700) < 0.5, "{:?}", &ks[515..700]);
        assert!(
            drafted(700..3000) < 0.05,
            "drafted {:.3} of the steps",
            drafted(700..3000)
        );
    }

    #[test]
    fn candidates_timed_at_other_contexts_do_not_win_a_review() {
        // Plain decoding wins throughout. Then every step gets twice as slow (a request with a
        // long context): the incumbent degrades and is reviewed, and drafting, whose numbers
        // date from the short contexts, must not look better than it is.
        let weak = acceptance(0.35, 3);
        let mut p = SpeculationPolicy::new(3, true);
        let cost = |k: usize| 1.0 + 0.3 * k as f64;
        drive(&mut p, 1, 300, &weak, cost);
        let long = drive(&mut p, 1, 300, &weak, |k| 2.0 * cost(k));
        assert!(share(&long, 0) > 0.9, "{long:?}");
    }

    #[test]
    fn a_batch_size_near_a_known_one_starts_from_its_choice() {
        // Plain decoding wins at batch 16. When a wave of requests drains, each smaller batch
        // size holds for a while: warming it up from the longest window would make the drafter
        // catch up on every sequence for nothing.
        let good = acceptance(0.8, 3);
        let loaded = |k: usize| 16.0 * (k + 1) as f64;
        let mut p = SpeculationPolicy::new(3, true);
        drive(&mut p, 16, 300, &good, loaded);
        let draining = drive(&mut p, 15, EXPLORE_EVERY as usize - 1, &good, loaded);
        assert!(draining.iter().all(|k| *k == 0), "{draining:?}");
    }

    #[test]
    fn costly_re_measurements_come_less_often() {
        // Plain decoding wins. Resuming drafting costs a catch-up pass: next to nothing in one
        // run, 300 steps' worth in the other (a long backlog through a deep drafter).
        let weak = acceptance(0.3, 3);
        let resumes = |catch_up: f64| {
            let mut p = SpeculationPolicy::new(3, true);
            let (mut previous, mut resumes) = (0, 0);
            drive_steps(&mut p, 1, 20_000, &weak, |_, k| {
                let resumed = previous == 0 && k > 0;
                resumes += usize::from(resumed);
                previous = k;
                decode_step(1, k, 1.0 + 0.5 * k as f64 + if resumed { catch_up } else { 0.0 }, &weak)
            });
            resumes
        };
        let (cheap, costly) = (resumes(0.0), resumes(300.0));
        assert!(costly * 3 <= cheap, "{cheap} cheap and {costly} costly resumes");
    }

    #[test]
    fn re_measures_often_while_a_window_that_could_win_has_little_evidence() {
        // One draft gives 1.5 tokens for 1.35x the step time: ahead, but not by the hysteresis.
        // Behind a dozen verifications the estimate may be far off (a first request's opening
        // tokens are harder to draft than the rest), so the wait must not grow yet.
        let drafted = |acceptance: &SpecStats, cost_per_draft: f64| {
            let mut policy = SpeculationPolicy::new(3, true);
            let ks = drive(&mut policy, 1, 20_000, acceptance, |k| 1.0 + cost_per_draft * k as f64);
            ks.iter().filter(|k| **k > 0).count()
        };
        let (thin, rich) = (acceptance_over(0.5, 3, 12), acceptance(0.5, 3));
        let (unsure, sure) = (drafted(&thin, 0.35), drafted(&rich, 0.35));
        assert!(
            unsure > 3 * sure,
            "{unsure} steps drafted on thin evidence, {sure} on plenty"
        );
        // Windows that would lose with every draft accepted need no more evidence.
        let (unsure, sure) = (drafted(&thin, 2.0), drafted(&rich, 2.0));
        assert!(
            unsure < 2 * sure,
            "{unsure} steps drafted on thin evidence, {sure} on plenty"
        );
    }

    #[test]
    fn larger_batches_do_not_try_longer_windows_than_smaller_ones_chose() {
        let good = acceptance(0.8, 7);
        let mut p = SpeculationPolicy::new(7, true);
        drive(&mut p, 1, 100, &good, |k| 1.0 + 0.05 * k as f64);
        drive(&mut p, 2, 100, &good, |k| if k == 1 { 1.0 } else { 1.0 + k as f64 });
        let wide = drive(&mut p, 3, 100, &good, |k| 1.0 + 0.05 * k as f64);
        assert!(wide.iter().all(|k| *k <= 1), "{wide:?}");
        assert!(share(&wide[20..], 1) > 0.9, "{wide:?}");
    }

    #[test]
    fn windows_that_cannot_win_even_fully_accepted_are_timed_twice() {
        let perfect = acceptance(1.0, 7);
        let mut p = SpeculationPolicy::new(7, true);
        // Compute-bound: every row of a window costs more than a plain step's row.
        let ks = drive(&mut p, 16, 300, &perfect, |k| 7.0 * (k + 1) as f64 * 1.5);
        for k in [1, 4, 7] {
            let steps = ks[..40].iter().filter(|x| **x == k).count();
            // The step that switches to k (it times nothing), then two timed steps.
            assert_eq!(steps, 1 + HOPELESS_STEPS, "k = {k}: {ks:?}");
        }
        assert!(share(&ks[40..], 0) > 0.95, "{ks:?}");
        // A window that could still win with enough accepted drafts gets its full warm-up.
        let mut p = SpeculationPolicy::new(7, true);
        let ks = drive(&mut p, 16, 40, &acceptance(0.3, 7), |k| 7.0 * (1.0 + 0.5 * k as f64));
        assert_eq!(ks.iter().filter(|x| **x == 1).count(), 1 + WARMUP_STEPS, "{ks:?}");
    }

    #[test]
    fn ignores_prefill_steps_and_the_step_after_a_change() {
        let mut p = SpeculationPolicy::new(3, true);
        let k = p.choose(1, &SpecStats::default());
        assert_eq!(k, 0, "plain decoding is timed first");
        for decode_only in [true, false] {
            // The first step has no previous k, the second runs prefill: neither counts.
            p.observe(StepSample {
                decode_only,
                ..decode_step(1, k, 1e9, &SpecStats::default())
            });
        }
        assert!(p.by_batch[0].candidates[0].recent.is_empty());
    }

    #[test]
    fn fixed_policy_and_no_drafter() {
        let any = acceptance(0.5, 5);
        let mut fixed = SpeculationPolicy::new(5, false);
        assert_eq!(drive(&mut fixed, 16, 50, &any, |k| 1.0 + k as f64), [5; 50]);
        let mut none = SpeculationPolicy::new(0, true);
        assert_eq!(drive(&mut none, 1, 10, &any, |_| 1.0), [0; 10]);
    }
}

//! How many drafts to propose at a given decode batch size.
//!
//! A verification window costs k + 1 target rows per sequence, so drafting pays while the
//! target is bound by reading its weights and loses once it is bound by arithmetic. Where that
//! turns depends on the device, both models and the acceptance rate, so the policy measures it
//! instead of guessing. Goodput with k drafts at batch size B is
//! `B * expected_tokens(k) / step_seconds(B, k)`:
//! - `expected_tokens` comes from the acceptance counts of every verification so far (they do
//!   not depend on the batch size, and pooling them keeps the estimate steady);
//! - `step_seconds` is a running average per batch size and candidate k, k = 0 (plain
//!   decoding) included, measured on decode-only steps.
//!
//! Speculating also costs what decode-only steps do not show: the drafter's pass over each
//! prompt and the catch-up pass after a pause. So a k > 0 must beat plain decoding by
//! `SPECULATION_MARGIN` to be chosen; measured on the demo model, that margin is what separates
//! "slightly faster per decode step" from "faster end to end".
//!
//! Each candidate is timed a few steps in a row, then the best runs, and every
//! `EXPLORE_EVERY` steps at a batch size the longest-unmeasured other candidate is timed again,
//! so the choice follows changes in context length and load. Drafting only gets less
//! worthwhile as the batch grows, so a batch size does not try a k above the best one of the
//! nearest smaller batch size: a ramp-up does not time long windows at every size again.

use crate::spec_stats::SpecStats;

/// Timed steps a candidate needs before the policy trusts its average.
const WARMUP_STEPS: u32 = 3;
/// Steps between re-measurements of the candidates that are not the best.
const EXPLORE_EVERY: u64 = 64;
/// Weight of a new step in a candidate's running average.
const SMOOTHING: f64 = 0.1;
/// How much more goodput than plain decoding a k > 0 must show in decode-only steps.
const SPECULATION_MARGIN: f64 = 0.1;

/// One engine step as the policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct StepSample {
    /// Sequences decoding in the step.
    pub batch: usize,
    /// Drafts per sequence proposed in the step.
    pub k: usize,
    pub seconds: f64,
    /// False when the step also ran prefill work, whose cost says nothing about k.
    pub decode_only: bool,
}

#[derive(Debug, Clone)]
struct Candidate {
    k: usize,
    seconds: f64,
    samples: u32,
    /// Decision count (at this batch size) of the last measurement.
    measured_at: u64,
}

#[derive(Debug, Clone)]
struct BatchStats {
    candidates: Vec<Candidate>,
    decisions: u64,
    /// Candidate being re-measured and the samples it still needs.
    exploring: Option<(usize, u32)>,
    /// The best k once every candidate this batch size tries is timed.
    best_k: Option<usize>,
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
}

impl SpeculationPolicy {
    /// `adaptive` false always proposes `max_k` drafts.
    pub fn new(max_k: usize, adaptive: bool) -> Self {
        Self {
            max_k,
            adaptive,
            by_batch: Vec::new(),
            previous_k: None,
        }
    }

    /// Drafts per sequence for a step with `batch` decoding sequences, given the acceptance
    /// measured so far.
    pub fn choose(&mut self, batch: usize, acceptance: &SpecStats) -> usize {
        if !self.adaptive || self.max_k == 0 {
            return self.max_k;
        }
        if batch == 0 {
            // Only prefill: the drafts follow each new prompt's first token, as a batch of one.
            return self.by_batch.first().and_then(|s| s.best_k).unwrap_or(self.max_k);
        }
        let ceiling = self.ceiling(batch);
        let stats = self.stats(batch);
        stats.decisions += 1;
        let allowed: Vec<usize> = (0..stats.candidates.len())
            .filter(|i| stats.candidates[*i].k <= ceiling)
            .collect();
        if let Some(&untimed) = allowed.iter().find(|i| stats.candidates[**i].samples < WARMUP_STEPS) {
            return stats.candidates[untimed].k;
        }
        let goodput = |c: &Candidate| {
            let margin = if c.k > 0 { 1.0 + SPECULATION_MARGIN } else { 1.0 };
            acceptance.expected_tokens(c.k) / c.seconds.max(f64::MIN_POSITIVE) / margin
        };
        let best = allowed
            .iter()
            .copied()
            .max_by(|a, b| goodput(&stats.candidates[*a]).total_cmp(&goodput(&stats.candidates[*b])))
            .expect("k = 0 is always allowed");
        let best_k = stats.candidates[best].k;
        if stats.best_k != Some(best_k) {
            let measured: Vec<(usize, f64)> = allowed
                .iter()
                .map(|i| {
                    (
                        stats.candidates[*i].k,
                        (batch as f64 * goodput(&stats.candidates[*i])).round(),
                    )
                })
                .collect();
            tracing::debug!(batch, k = best_k, scores = ?measured, "speculation policy: new best k");
            stats.best_k = Some(best_k);
        }
        if stats.exploring.is_none() && stats.decisions.is_multiple_of(EXPLORE_EVERY) {
            let stale = allowed
                .iter()
                .copied()
                .filter(|i| *i != best)
                .min_by_key(|i| stats.candidates[*i].measured_at);
            // One more step than the samples: the first step after the switch is not timed.
            stats.exploring = stale.map(|i| (i, WARMUP_STEPS));
        }
        match stats.exploring {
            Some((i, _)) => stats.candidates[i].k,
            None => best_k,
        }
    }

    /// Records what a step cost.
    pub fn observe(&mut self, step: StepSample) {
        let steady = self.previous_k == Some(step.k);
        self.previous_k = Some(step.k);
        if !self.adaptive || !steady || !step.decode_only || step.batch == 0 {
            return;
        }
        let stats = self.stats(step.batch);
        let decisions = stats.decisions;
        let Some(i) = stats.candidates.iter().position(|c| c.k == step.k) else {
            return;
        };
        let c = &mut stats.candidates[i];
        c.samples += 1;
        c.seconds += (1.0 / c.samples as f64).max(SMOOTHING) * (step.seconds - c.seconds);
        c.measured_at = decisions;
        if let Some((j, left)) = stats.exploring {
            stats.exploring = match (j == i, left) {
                (true, 1) => None,
                (true, left) => Some((j, left - 1)),
                (false, _) => Some((j, left)),
            };
        }
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
                        seconds: 0.0,
                        samples: 0,
                        measured_at: 0,
                    })
                    .collect(),
                decisions: 0,
                exploring: None,
                best_k: None,
            };
            self.by_batch.resize(index + 1, template);
        }
        &mut self.by_batch[index]
    }
}

/// K, about K/2, 1 and 0, largest first: a few points spanning the cost curve keep the
/// measuring cheap.
fn candidate_ks(max_k: usize) -> Vec<usize> {
    let mut ks = vec![max_k, max_k.div_ceil(2), 1, 0];
    ks.dedup();
    ks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Acceptance where each draft position is accepted with probability `p` given the ones
    /// before were.
    fn acceptance(p: f64, k: usize) -> SpecStats {
        let mut s = SpecStats::default();
        let mut reached = 1000.0;
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
        seconds: impl Fn(usize) -> f64,
    ) -> Vec<usize> {
        (0..steps)
            .map(|_| {
                let k = p.choose(batch, acceptance);
                p.observe(StepSample {
                    batch,
                    k,
                    seconds: seconds(k),
                    decode_only: true,
                });
                k
            })
            .collect()
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
        let after = drive(&mut p, 2, 600, &good, |k| 1.0 + 2.0 * k as f64);
        assert!(share(&after[300..], 0) > 0.9, "{after:?}");
        assert!(
            share(&after[300..], 0) < 1.0,
            "the other candidates must be re-timed now and then"
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
    fn ignores_prefill_steps_and_the_step_after_a_change() {
        let mut p = SpeculationPolicy::new(3, true);
        let k = p.choose(1, &SpecStats::default());
        assert_eq!(k, 3);
        for decode_only in [true, false] {
            // The first step has no previous k, the second runs prefill: neither counts.
            p.observe(StepSample {
                batch: 1,
                k,
                seconds: 1e9,
                decode_only,
            });
        }
        assert_eq!(p.by_batch[0].candidates[0].samples, 0);
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

//! The tokens a sampled row draws from and their probabilities, as the definition below has
//! them bit for bit, without sorting the vocabulary.
//!
//! The definition (`SamplingParams::probabilities`): take a NaN logit for negative infinity, so
//! that it is never kept (as `argmax` and the device's Gumbel draw never choose it), order the
//! row by logit (`top_tokens`), cut the order to the top-k, weigh each token
//! `exp((logit - max) / T)` in f64, drop the weights below min_p (a tail: the first token
//! weighs 1 and weights fall along the order), then keep the shortest prefix whose running
//! f64 sum reaches top_p times the sum of all the weights left, the total. A kept token's
//! probability is its weight over that running sum.
//!
//! Here only a prefix of the order is ordered, by partial selection, and extended until the
//! cut is decided; its running sums are the definition's own. The total is the definition's
//! too where the prefix holds all its terms (top-k or min-p ends the order there) or the rest
//! vanish in its rounding. Otherwise it is bracketed: the prefix's sum plus the rest's weights,
//! summed unordered with a vector `exp` and widened by their errors. A running sum below top_p
//! times the whole bracket, or above it, decides; one inside it extends the prefix, and the
//! whole order decides everything.
//!
//! Logits on a GPU are not ordered here: the device sends a row's first tokens and the rest's
//! sums (`row_candidates`), and the same cut decides from them or tells the caller to read
//! the row (`nucleus_of_candidates`).

use crate::sampling_params::SamplingParams;
use crate::top_tokens::top_tokens;
use peagle_kernels::{exp_in_place, RowCandidates};

/// Tokens ordered first: a peaked row's nucleus fits.
const FIRST_COUNT: usize = 64;
/// Bound on the weights' relative error where they are summed unordered, with room: the
/// vector `exp` is within one ulp of the rounded exact value (tested), 1.5 ulps of f32
/// (2^-22.4) from the exact one; CUDA's `expf` within 2 ulps (2^-22).
const EXP_ERROR: f64 = 1.0 / (1u64 << 21) as f64;
/// Bound on those weights' absolute error where a result is subnormal or flushed to zero.
const FLUSHED: f64 = f32::MIN_POSITIVE as f64;
/// Logits per call of the vector `exp`.
const CHUNK: usize = 256;
/// Partial sums the vector `exp`'s results go to.
const LANES: usize = 8;

/// The kept tokens of `logits` under `params` (not greedy), in index order, with their
/// probabilities.
pub fn nucleus(logits: &[f32], params: &SamplingParams) -> Vec<(u32, f32)> {
    // One pass the compiler vectorises; a row with NaN, a model gone wrong, pays for a copy.
    if logits.iter().fold(false, |any, l| any | l.is_nan()) {
        let scrubbed: Vec<f32> = logits
            .iter()
            .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l })
            .collect();
        return nucleus(&scrubbed, params);
    }
    let len = order_len(params, logits.len());
    let mut order = top_tokens(logits, if params.top_k > 0 { len } else { len.min(FIRST_COUNT) }, None);
    let Some(&first) = order.first() else {
        return Vec::new();
    };
    // The largest logit, as `f32::max` finds it but for the sign of a zero, which no weight sees.
    let max = logits[first as usize];
    let scaled = |logit: f32| (logit - max) / params.temperature;
    let mut row_sums = None;
    loop {
        let prefix: Vec<(u32, f32)> = order.iter().map(|&i| (i, logits[i as usize])).collect();
        let rest = || {
            let row = *row_sums.get_or_insert_with(|| VectorSums::of(logits, &scaled, params.min_p));
            let ordered: Vec<f32> = prefix.iter().map(|(_, l)| *l).collect();
            row.less(VectorSums::of(&ordered, &scaled, params.min_p))
        };
        let (low, sum, last) = match decide(&prefix, order.len() == len, rest, logits.len(), params) {
            Decision::Kept(kept) => return kept,
            Decision::Beyond { low, sum, last } => (low, sum, last),
        };
        // Each weight still to come is at most `last`: at least this many more reach the cut.
        let needed = ((params.top_p as f64 * low - sum) / last).max(0.0);
        let more = order.len().max(2 * needed as usize).min(len - order.len());
        order.extend(top_tokens(logits, more, order.last().copied()));
    }
}

/// The kept tokens as `nucleus` has them, from a row's first tokens in the order with their
/// logits and its other tokens' weights (`row_candidates`, split at `weight_thresholds`), or
/// None where those do not decide the cut. `vocab` is the row's length.
pub fn nucleus_of_candidates(
    candidates: &RowCandidates,
    vocab: usize,
    params: &SamplingParams,
) -> Option<Vec<(u32, f32)>> {
    let len = order_len(params, vocab);
    let prefix = &candidates.first[..candidates.first.len().min(len)];
    // The rest's sums cover every other token of the row: past a top-k they would count
    // tokens the cut never sees. A NaN in the order (first, or last with its sign bit set)
    // puts it where the definition's negative infinity is not, and spoils the sums' maximum:
    // the row decides.
    if prefix.is_empty() || (params.top_k > 0 && prefix.len() < len) || prefix.iter().any(|(_, l)| l.is_nan()) {
        return None;
    }
    let rest = || VectorSums {
        sure: candidates.above,
        unsure: candidates.between,
    };
    match decide(prefix, prefix.len() == len, rest, vocab, params) {
        Decision::Kept(kept) => Some(kept),
        Decision::Beyond { .. } => None,
    }
}

/// The weights `row_candidates` sums apart for `min_p`, as (lo, hi): one at least hi is surely
/// at least min_p, one below lo surely below it; those between are too close to tell.
pub fn weight_thresholds(min_p: f32) -> (f64, f64) {
    let min_p = min_p as f64;
    (
        (min_p - FLUSHED) / (1.0 + EXP_ERROR),
        (min_p + FLUSHED) / (1.0 - EXP_ERROR),
    )
}

/// The length of the order the definition cuts: the top-k, or the whole row.
fn order_len(params: &SamplingParams, vocab: usize) -> usize {
    match params.top_k {
        0 => vocab,
        k => k.min(vocab),
    }
}

/// What a prefix of the order decides.
enum Decision {
    /// The kept tokens, in index order, with their probabilities.
    Kept(Vec<(u32, f32)>),
    /// The cut lies past the prefix, or too close to the bracket to tell: the bracket's low
    /// end, the prefix's running sum and its last weight.
    Beyond { low: f64, sum: f64, last: f64 },
}

/// The definition's cut over `prefix`, a non-empty prefix of the order with its logits;
/// `complete` when it holds the whole order, `rest` the sums over every token of the row
/// outside it, asked for only when the prefix's own weights do not settle the total.
fn decide(
    prefix: &[(u32, f32)],
    complete: bool,
    rest: impl FnOnce() -> VectorSums,
    vocab: usize,
    params: &SamplingParams,
) -> Decision {
    let max = prefix[0].1;
    let min_p = params.min_p as f64;
    let weights: Vec<f64> = prefix
        .iter()
        .map(|&(_, logit)| (((logit - max) / params.temperature) as f64).exp())
        .take_while(|w| *w >= min_p)
        .collect();
    let sum: f64 = weights.iter().sum();
    let last = weights.last().copied().unwrap_or_default();
    let total = if weights.len() < prefix.len() || complete || sum + last == sum {
        // Every later weight is at most the last one: none is left, or each vanishes.
        Total::Exact(sum)
    } else {
        rest().bracket(sum, vocab)
    };
    match cut(&weights, total, params.top_p) {
        Cut::Keep(keep, kept_sum) => {
            let mut kept: Vec<(u32, f32)> = prefix
                .iter()
                .zip(&weights[..keep])
                .map(|(&(i, _), w)| (i, (w / kept_sum) as f32))
                .collect();
            kept.sort_unstable_by_key(|(i, _)| *i);
            Decision::Kept(kept)
        }
        Cut::Beyond(low) => Decision::Beyond { low, sum, last },
    }
}

/// The definition's total: known, or within a bracket.
#[derive(Debug, Clone, Copy)]
enum Total {
    Exact(f64),
    Between(f64, f64),
}

/// Where the cut falls in a prefix of the order.
enum Cut {
    /// It keeps this many, whose running sum is this.
    Keep(usize, f64),
    /// It lies past the prefix, or the bracket (low end here) is too wide to tell.
    Beyond(f64),
}

/// The definition's cut over the ordered `weights`, a prefix of the order, given its total.
fn cut(weights: &[f64], total: Total, top_p: f32) -> Cut {
    let (low, high) = match total {
        Total::Exact(t) => (t, t),
        Total::Between(low, high) => (low, high),
    };
    let (reach_low, reach_high) = (top_p as f64 * low, top_p as f64 * high);
    let mut sum = 0.0;
    for (j, w) in weights.iter().enumerate() {
        sum += w;
        if sum >= reach_high {
            return Cut::Keep(j + 1, sum);
        }
        if sum >= reach_low {
            return Cut::Beyond(low);
        }
    }
    match total {
        Total::Exact(_) => Cut::Keep(weights.len(), sum),
        Total::Between(..) => Cut::Beyond(low),
    }
}

/// Weights summed in no particular order with the vector `exp`, apart by whether they are
/// surely at least min_p or too close to it to tell: each is off by `EXP_ERROR` relative or
/// `FLUSHED`. The vector `exp` gives a token the same value wherever it is computed, so the
/// sums over a part of the row come off those over the whole exactly but for rounding.
#[derive(Debug, Clone, Copy, Default)]
struct VectorSums {
    sure: f64,
    unsure: f64,
}

impl VectorSums {
    fn of(logits: &[f32], scaled: &impl Fn(f32) -> f32, min_p: f32) -> Self {
        // The bounds' own rounding is well within `EXP_ERROR`'s room.
        let (unsure_from, sure_from) = weight_thresholds(min_p);
        let mut sure = [0f64; LANES];
        let mut unsure = [0f64; LANES];
        let mut exps = [0f32; CHUNK];
        for chunk in logits.chunks(CHUNK) {
            let exps = &mut exps[..chunk.len()];
            for (e, &logit) in exps.iter_mut().zip(chunk) {
                *e = scaled(logit);
            }
            exp_in_place(exps);
            // Lanes without branches, which the compiler vectorises.
            for group in exps.chunks(LANES) {
                for (lane, &e) in group.iter().enumerate() {
                    let e = e as f64;
                    sure[lane] += if e >= sure_from { e } else { 0.0 };
                    unsure[lane] += if e >= unsure_from && e < sure_from { e } else { 0.0 };
                }
            }
        }
        Self {
            sure: sure.iter().sum(),
            unsure: unsure.iter().sum(),
        }
    }

    /// These sums over a row less those over a part of it: the sums over the rest, each term
    /// computed alike in both.
    fn less(self, part: Self) -> Self {
        Self {
            sure: (self.sure - part.sure).max(0.0),
            unsure: (self.unsure - part.unsure).max(0.0),
        }
    }

    /// Brackets the total from these sums over the tokens of a row of `n` outside the prefix
    /// whose running sum is `prefix`. A sum of at most `n` terms in any order is within `n`
    /// epsilons of the exact one, relative (f64's `exp`, within an ulp, adds one; so does
    /// taking a part's sums off the row's): the slack allows four times that, on top of the
    /// `exp` bound.
    fn bracket(self, prefix: f64, n: usize) -> Total {
        let n = n as f64;
        let all = self.sure + self.unsure;
        let rounding = 4.0 * n * f64::EPSILON * (prefix + all) + n * FLUSHED;
        let low = prefix + self.sure * (1.0 - EXP_ERROR) - rounding;
        let high = prefix + all * (1.0 + EXP_ERROR) + rounding;
        Total::Between(low.max(prefix), high)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::draw;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// The definition as a full sort computes it: the reference for `nucleus`.
    fn sorted_probabilities(params: &SamplingParams, logits: &[f32]) -> Vec<f32> {
        let logits: Vec<f32> = logits
            .iter()
            .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l })
            .collect();
        let mut probs = vec![0f32; logits.len()];
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b)));
        if params.top_k > 0 {
            order.truncate(params.top_k);
        }
        let mut weights: Vec<f64> = order
            .iter()
            .map(|i| (((logits[*i] - max) / params.temperature) as f64).exp())
            .collect();
        weights.retain(|w| *w >= params.min_p as f64);
        let total: f64 = weights.iter().sum();
        let mut kept = 0.0;
        let mut keep = 0;
        for w in &weights {
            kept += w;
            keep += 1;
            if kept >= params.top_p as f64 * total {
                break;
            }
        }
        for (i, w) in order.iter().zip(&weights).take(keep) {
            probs[*i] = (w / kept) as f32;
        }
        probs
    }

    fn dense(kept: &[(u32, f32)], n: usize) -> Vec<f32> {
        let mut probs = vec![0f32; n];
        for &(i, p) in kept {
            probs[i as usize] = p;
        }
        probs
    }

    /// Rows of every shape the cut meets: flat and peaked, wide-ranged (terms vanishing in
    /// the total), ties everywhere, tokens held back at negative infinity, and NaN of either
    /// sign.
    fn rows(rng: &mut StdRng) -> Vec<Vec<f32>> {
        let mut rows = Vec::new();
        for n in [1, 3, 50, 700, 5000] {
            for spread in [0.1f32, 1.0, 3.0, 40.0] {
                rows.push((0..n).map(|_| spread * (rng.random::<f32>() - 0.5) * 4.0).collect());
            }
            // Quarter steps over a narrow range: many equal logits.
            rows.push((0..n).map(|_| rng.random_range(0..8) as f32 * 0.25).collect());
            rows.push(vec![1.0; n]);
            let mut held: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 6.0).collect();
            for l in held.iter_mut().step_by(3) {
                *l = f32::NEG_INFINITY;
            }
            rows.push(held);
            let mut broken: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 6.0).collect();
            for (j, l) in broken.iter_mut().step_by(4).enumerate() {
                *l = if j % 2 == 0 { f32::NAN } else { -f32::NAN };
            }
            rows.push(broken);
        }
        rows
    }

    #[test]
    fn partial_selection_gives_the_full_sorts_probabilities_and_draws() {
        let mut rng = StdRng::seed_from_u64(5);
        let rows = rows(&mut rng);
        let mut cases = 0;
        for temperature in [0.05f32, 0.8, 1.0, 2.5] {
            for top_k in [0, 1, 2, 50, 6000] {
                for top_p in [1.0f32, 0.999_999, 0.95, 0.5, 0.1, 1e-6] {
                    for min_p in [0.0f32, 0.05, 0.9, 1.0] {
                        let params = SamplingParams {
                            temperature,
                            top_k,
                            top_p,
                            min_p,
                            ..SamplingParams::default()
                        };
                        for (r, row) in rows.iter().enumerate() {
                            let expected = sorted_probabilities(&params, row);
                            let kept = nucleus(row, &params);
                            let ours = dense(&kept, row.len());
                            let bits = |p: &[f32]| p.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(&ours), bits(&expected), "row {r} under {params:?}");
                            for seed in 0..3 {
                                let mut a = StdRng::seed_from_u64(seed);
                                let mut b = a.clone();
                                assert_eq!(draw(&mut a, &expected), crate::sampler::draw_kept(&mut b, &kept));
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 4 * 5 * 6 * 4 * rows.len());
    }

    /// From a device's first tokens and sums (the host's reference computation of them here),
    /// the cut keeps what `nucleus` keeps, bit for bit, or is left undecided: never where the
    /// first tokens hold the whole order (a short row, a top-k within them), and for most
    /// cuts elsewhere.
    #[test]
    fn first_tokens_and_the_rests_sums_decide_the_cut_as_the_row_does() {
        let mut rng = StdRng::seed_from_u64(6);
        let rows = rows(&mut rng);
        let (mut decided, mut cases) = (0, 0);
        for temperature in [0.05f32, 1.0, 2.5] {
            for min_p in [0.0f32, 0.05, 0.9] {
                let (lo, hi) = weight_thresholds(min_p);
                for (r, row) in rows.iter().enumerate() {
                    let logits =
                        candle_core::Tensor::from_slice(row, (1, row.len()), &candle_core::Device::Cpu).unwrap();
                    let request = peagle_kernels::CandidateRequest {
                        row: 0,
                        temperature,
                        lo,
                        hi,
                    };
                    let candidates = peagle_kernels::row_candidates(&logits, &[request], 100)
                        .unwrap()
                        .remove(0);
                    for top_k in [0, 1, 50, 100, 101] {
                        for top_p in [1.0f32, 0.95, 0.5, 1e-6] {
                            let params = SamplingParams {
                                temperature,
                                top_k,
                                top_p,
                                min_p,
                                ..SamplingParams::default()
                            };
                            let got = nucleus_of_candidates(&candidates, row.len(), &params);
                            cases += 1;
                            let Some(kept) = got else {
                                let whole = row.len() <= 100 || (1..=100).contains(&top_k);
                                assert!(!whole || row.iter().any(|l| l.is_nan()), "row {r} under {params:?}");
                                continue;
                            };
                            decided += 1;
                            let bits = |k: &[(u32, f32)]| k.iter().map(|(i, p)| (*i, p.to_bits())).collect::<Vec<_>>();
                            assert_eq!(bits(&kept), bits(&nucleus(row, &params)), "row {r} under {params:?}");
                        }
                    }
                }
            }
        }
        assert!(decided * 10 > cases * 7, "{decided} of {cases} decided");
    }

    /// A row with no token left (every logit negative infinity, as constraints can leave one)
    /// keeps none, from the row and from its first tokens alike, and so draws token 0: what
    /// `argmax` chooses there, and the device's Gumbel draw.
    #[test]
    fn a_row_with_no_token_left_draws_token_0() {
        let row = [f32::NEG_INFINITY; 300];
        let logits = candle_core::Tensor::from_slice(&row, (1, row.len()), &candle_core::Device::Cpu).unwrap();
        assert_eq!(crate::sampler::argmax(&row), 0);
        for (top_k, top_p, min_p) in [(0, 1.0, 0.0), (5, 0.9, 0.0), (0, 0.5, 0.1), (50, 1e-6, 1.0)] {
            let params = SamplingParams {
                temperature: 0.8,
                top_k,
                top_p,
                min_p,
                ..SamplingParams::default()
            };
            let kept = nucleus(&row, &params);
            assert_eq!(kept, [], "{params:?}");
            assert_eq!(crate::sampler::draw_kept(&mut StdRng::seed_from_u64(1), &kept), 0);
            let (lo, hi) = weight_thresholds(min_p);
            let request = peagle_kernels::CandidateRequest {
                row: 0,
                temperature: 0.8,
                lo,
                hi,
            };
            let candidates = peagle_kernels::row_candidates(&logits, &[request], 100)
                .unwrap()
                .remove(0);
            let from_candidates = nucleus_of_candidates(&candidates, row.len(), &params);
            assert_eq!(from_candidates, Some(kept), "{params:?}");
        }
    }
}

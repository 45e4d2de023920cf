//! Next-token choice from a row of logits: greedy, or temperature / min-p / top-k / top-p
//! sampling with a per-request seeded generator.

use crate::nucleus::nucleus;
use crate::sampling_params::SamplingParams;
use peagle_kernels::splitmix64;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

impl SamplingParams {
    /// The distribution sampling draws from: softmax(logits / T) restricted to the tokens at
    /// least min_p times as likely as the most likely one, the top-k and the top-p nucleus,
    /// renormalised (`nucleus` spells the definition out). Greedy puts all mass on the argmax.
    pub fn probabilities(&self, logits: &[f32]) -> Vec<f32> {
        let mut probs = vec![0f32; logits.len()];
        if self.is_greedy() {
            probs[argmax(logits)] = 1.0;
            return probs;
        }
        for (i, p) in nucleus(logits, self) {
            probs[i as usize] = p;
        }
        probs
    }
}

/// Index of the largest value; ties go to the lowest index so greedy is deterministic. NaN is
/// never chosen, and a row of nothing else gives 0: the rule of `peagle_kernels::argmax_rows`,
/// by which a GPU chooses greedy rows.
pub fn argmax(values: &[f32]) -> usize {
    let Some(first) = values.iter().position(|v| !v.is_nan()) else {
        return 0;
    };
    let (mut best, mut largest) = (first, values[first]);
    // A block's maximum, in lanes the compiler vectorises, is looked up only where it rises.
    for (b, block) in values.chunks(ARGMAX_BLOCK).enumerate() {
        let mut lanes = [f32::NEG_INFINITY; 8];
        for group in block.chunks(lanes.len()) {
            for (lane, v) in lanes.iter_mut().zip(group) {
                *lane = lane.max(*v);
            }
        }
        let max = lanes.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max > largest {
            best = b * ARGMAX_BLOCK
                + block
                    .iter()
                    .position(|v| *v == max)
                    .expect("the block holds its maximum");
            largest = max;
        }
    }
    best
}

/// Values `argmax` takes the maximum of at once.
const ARGMAX_BLOCK: usize = 64;

/// A request's randomness, keyed by the position of the token being drawn: the draws for
/// position p depend only on the seed and p. So a seeded request gets the same tokens however
/// many drafts each step proposes (the adaptive k changes with load) and whatever shares its
/// batch.
pub struct Sampler {
    seed: u64,
}

impl Sampler {
    pub fn new(seed: Option<u64>) -> Self {
        Self {
            seed: seed.unwrap_or_else(rand::random),
        }
    }

    /// The key of the randomness for the token at `position`.
    pub fn key(&self, position: usize) -> u64 {
        splitmix64(self.seed ^ splitmix64(position as u64))
    }

    /// The random stream for the token at `position`.
    pub fn at(&self, position: usize) -> StdRng {
        StdRng::seed_from_u64(self.key(position))
    }

    /// The token at `position` drawn from `logits` under `params`.
    pub fn sample(&self, logits: &[f32], params: &SamplingParams, position: usize) -> u32 {
        if params.is_greedy() {
            return argmax(logits) as u32;
        }
        self.draw(&nucleus(logits, params), position)
    }

    /// The token at `position` drawn from `kept`, a row's nucleus (`nucleus`).
    pub fn draw(&self, kept: &[(u32, f32)], position: usize) -> u32 {
        draw_kept(&mut self.at(position), kept) as u32
    }
}

/// Index drawn from `probs`, which need not be normalised.
pub fn draw(rng: &mut impl Rng, probs: &[f32]) -> usize {
    draw_from(rng, probs.iter().copied().enumerate())
}

/// Token drawn from `kept`, tokens in index order with their probabilities (`nucleus`): the
/// same draw as `draw` over the dense row, whose zeros add nothing and are skipped.
pub fn draw_kept(rng: &mut impl Rng, kept: &[(u32, f32)]) -> usize {
    draw_from(rng, kept.iter().map(|&(i, p)| (i as usize, p)))
}

/// Walks `probs` (index, probability) in index order down to a uniform share of their total.
fn draw_from(rng: &mut impl Rng, probs: impl Iterator<Item = (usize, f32)> + Clone) -> usize {
    let total: f64 = probs.clone().map(|(_, p)| p as f64).sum();
    let mut u = rng.random::<f64>() * total;
    let mut last = 0;
    for (i, p) in probs {
        if p > 0.0 {
            last = i;
            u -= p as f64;
            if u < 0.0 {
                return i;
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_k: usize, top_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        let s = Sampler::new(Some(0));
        assert_eq!(s.sample(&[0.0, 2.0, 1.0], &SamplingParams::default(), 0), 1);
    }

    /// The host's argmax picks what the device's does (`argmax_rows`, whose CPU forward is its
    /// GPU kernel's reference), NaN and ties included, so a greedy row chooses the same token
    /// on either.
    #[test]
    fn argmax_by_blocks_is_the_devices_first_largest() {
        let device = |values: &[f32]| {
            let row = candle_core::Tensor::from_slice(values, (1, values.len()), &candle_core::Device::Cpu).unwrap();
            peagle_kernels::argmax_rows(&row, &[0]).unwrap()[0] as usize
        };
        let mut rng = StdRng::seed_from_u64(9);
        let specials = [0.0, -0.0, 1.0, 2.5, f32::NEG_INFINITY, f32::INFINITY, f32::NAN];
        for n in [1, 2, 63, 64, 65, 200, 1000] {
            for _ in 0..50 {
                let values: Vec<f32> = (0..n).map(|_| specials[rng.random_range(0..specials.len())]).collect();
                assert_eq!(argmax(&values), device(&values), "{values:?}");
                let values: Vec<f32> = (0..n).map(|_| rng.random::<f32>()).collect();
                assert_eq!(argmax(&values), device(&values));
            }
        }
        let nan = f32::NAN;
        for values in [
            [nan, 1.0, 2.0],
            [nan, f32::NEG_INFINITY, f32::NEG_INFINITY],
            [nan, nan, nan],
        ] {
            assert_eq!(argmax(&values), device(&values), "{values:?}");
        }
        assert_eq!(argmax(&[nan, 1.0, 2.0]), 2);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn top_k_and_top_p_cut_the_tail() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let p = params(1.0, 2, 1.0).probabilities(&logits);
        assert_eq!((p[2], p[3]), (0.0, 0.0));
        assert!((p[0] + p[1] - 1.0).abs() < 1e-6);
        // softmax([2,1,0,-1]) = [.644, .237, .087, .032]: the nucleus of 0.85 is the first two.
        let p = params(1.0, 0, 0.85).probabilities(&logits);
        assert!(p[0] > 0.0 && p[1] > 0.0 && p[2] == 0.0 && p[3] == 0.0, "{p:?}");
        // min_p 0.3 keeps tokens at least 0.3 times as likely as the first: e^-1 = .37 is in,
        // e^-2 = .14 is out.
        let p = SamplingParams {
            min_p: 0.3,
            ..params(1.0, 0, 1.0)
        }
        .probabilities(&logits);
        assert!(p[1] > 0.0 && p[2] == 0.0 && p[3] == 0.0, "{p:?}");
        assert!((p[0] + p[1] - 1.0).abs() < 1e-6);
    }

    /// A NaN logit is never drawn, whatever the cut, as the device's Gumbel draw and argmax
    /// never choose one: the other tokens share the row as if it were not there.
    #[test]
    fn a_nan_logit_is_never_drawn() {
        let nan = f32::NAN;
        let logits = [nan, 0.0, 1.0, -nan, 0.5];
        let s = Sampler::new(Some(3));
        for (top_k, top_p) in [(0, 1.0), (2, 1.0), (0, 0.9), (5, 0.5)] {
            let pr = params(1.0, top_k, top_p);
            let mut seen = [0usize; 5];
            for position in 0..500 {
                seen[s.sample(&logits, &pr, position) as usize] += 1;
            }
            assert_eq!(
                (seen[0], seen[3]),
                (0, 0),
                "{seen:?} under top_k {top_k}, top_p {top_p}"
            );
            assert!(seen[2] > 0, "{seen:?}");
            let probs = pr.probabilities(&logits);
            let without: Vec<f32> = [f32::NEG_INFINITY, 0.0, 1.0, f32::NEG_INFINITY, 0.5].to_vec();
            assert_eq!(probs, pr.probabilities(&without));
        }
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
        let logits = [1.0f32, 0.0, 0.5];
        let pr = params(1.0, 0, 1.0);
        let draws = |seed| {
            let s = Sampler::new(Some(seed));
            (0..4000)
                .map(|position| s.sample(&logits, &pr, position))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        let counts = draws(7).iter().fold([0usize; 3], |mut c, t| {
            c[*t as usize] += 1;
            c
        });
        let probs = pr.probabilities(&logits);
        for i in 0..3 {
            let expected = probs[i] as f64 * 4000.0;
            assert!(
                (counts[i] as f64 - expected).abs() < 4.0 * expected.sqrt(),
                "{counts:?} vs {probs:?}"
            );
        }
    }
}

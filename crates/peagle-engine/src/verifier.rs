//! Verification of drafts against the target's logits for the window `[b, d1..dK]`.
//!
//! Row i of the window's logits is the target's distribution for the token after `d_i` (row 0:
//! after `b`). Greedy keeps the longest prefix of drafts equal to the target's argmax and then
//! emits the target's own token.
//!
//! With temperature and greedy drafts (q one-hot, what our drafters propose), each row draws the
//! target's own token with that position's randomness and the draft is kept while it equals
//! it. A draft d is then accepted with probability p(d), as rejection sampling would, and the
//! output is token for token what the target alone samples with the same seed. With a drafter
//! distribution q, rejection sampling (Leviathan et al. 2023) accepts `d_i` with probability
//! min(1, p(d_i) / q(d_i)) and on rejection draws from normalize(max(0, p - q)): distributed
//! exactly as the target's output, though not equal to it draw for draw.

use crate::sampler::{draw, Sampler};
use crate::sampling_params::SamplingParams;
use rand::Rng;

/// What one verification commits: `accepted` drafts followed by one target token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub accepted: usize,
    pub tokens: Vec<u32>,
}

/// `logits` has one row per window position (drafts.len() + 1 rows), read in order and only
/// up to the first rejection; row 0 draws the token at `position` of the sequence.
/// `draft_probs`, when given, holds the drafter's distribution q for each draft; without it
/// drafts count as greedy picks (q one-hot).
pub fn verify<R: AsRef<[f32]>>(
    drafts: &[u32],
    logits: impl IntoIterator<Item = R, IntoIter: ExactSizeIterator>,
    draft_probs: Option<&[Vec<f32>]>,
    params: &SamplingParams,
    sampler: &Sampler,
    position: usize,
) -> Verdict {
    let mut rows = logits.into_iter();
    assert_eq!(rows.len(), drafts.len() + 1, "one logits row per window position");
    // Greedy, or greedy drafts: each row chooses the target's own token (its argmax, or its
    // draw with that position's randomness) and the drafts are kept while they equal it.
    let Some(q) = draft_probs.filter(|_| !params.is_greedy()) else {
        let own = rows
            .enumerate()
            .map(|(i, row)| sampler.sample(row.as_ref(), params, position + i));
        return keep_matching(drafts, own);
    };
    for (i, &d) in drafts.iter().enumerate() {
        let mut rng = sampler.at(position + i);
        let row = rows.next().expect("a row per draft");
        let p = params.probabilities(row.as_ref());
        let q_d = q[i][d as usize];
        // A draft its drafter gave no chance was not drawn from q: rejected, as vLLM does, so
        // that no token the target rules out (p(d) = 0) is ever committed.
        let accept = if q_d <= 0.0 {
            0.0
        } else {
            (p[d as usize] / q_d).min(1.0)
        };
        if rng.random::<f64>() < accept as f64 {
            continue;
        }
        let residual: Vec<f32> = p.iter().zip(&q[i]).map(|(p, q)| (p - q).max(0.0)).collect();
        // p == q leaves no residual mass, but then the draft was accepted with probability 1.
        let token = if residual.iter().any(|r| *r > 0.0) {
            draw(&mut rng, &residual)
        } else {
            draw(&mut rng, &p)
        };
        return commit(drafts, i, token as u32);
    }
    let last = drafts.len();
    let bonus = rows.next().expect("the bonus row");
    commit(drafts, last, sampler.sample(bonus.as_ref(), params, position + last))
}

/// The drafts kept while each equals the target's own token for its row (`own`, one per row,
/// taken only up to the first that differs), then that token, or the last row's when all are
/// kept.
pub fn keep_matching(drafts: &[u32], own: impl IntoIterator<Item = u32>) -> Verdict {
    for (i, token) in own.into_iter().enumerate() {
        if drafts.get(i) != Some(&token) {
            return commit(drafts, i, token);
        }
    }
    unreachable!("the last row has no draft to match");
}

fn commit(drafts: &[u32], accepted: usize, token: u32) -> Verdict {
    let mut tokens = drafts[..accepted].to_vec();
    tokens.push(token);
    Verdict { accepted, tokens }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_hot(v: usize, i: usize) -> Vec<f32> {
        let mut x = vec![-10.0; v];
        x[i] = 10.0;
        x
    }

    #[test]
    fn greedy_keeps_the_matching_prefix_and_adds_the_target_token() {
        let logits = vec![one_hot(8, 3), one_hot(8, 5), one_hot(8, 1), one_hot(8, 7)];
        let s = Sampler::new(Some(0));
        let g = SamplingParams::default();
        let v = verify(&[3, 5, 2], &logits, None, &g, &s, 0);
        assert_eq!(
            v,
            Verdict {
                accepted: 2,
                tokens: vec![3, 5, 1]
            }
        );
        let v = verify(&[3, 5, 1], &logits, None, &g, &s, 0);
        assert_eq!(
            v,
            Verdict {
                accepted: 3,
                tokens: vec![3, 5, 1, 7]
            },
            "bonus token after all accepted"
        );
        let v = verify(&[4, 5, 1], &logits, None, &g, &s, 0);
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                tokens: vec![3]
            }
        );
        let v = verify(&[], &logits[..1], None, &g, &s, 0);
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                tokens: vec![3]
            },
            "no drafts is plain decoding"
        );
    }

    /// A draft the drafter's distribution gives no chance is rejected, so a token the target
    /// rules out (here by its top-k cut) is never committed.
    #[test]
    fn a_draft_outside_the_drafters_distribution_is_rejected() {
        let rows = vec![vec![2.0, 1.0, 0.5, 0.0], vec![0.0; 4]];
        let q = vec![vec![0.0, 1.0, 0.0, 0.0]];
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 1,
            ..SamplingParams::default()
        };
        for seed in 0..50 {
            let v = verify(&[2], &rows, Some(&q), &params, &Sampler::new(Some(seed)), 0);
            assert_eq!((v.accepted, v.tokens), (0, vec![0]), "seed {seed}");
        }
    }

    /// With temperature and greedy drafts, the committed tokens are exactly the target's own
    /// samples at those positions, whatever was drafted.
    #[test]
    fn sampled_verification_commits_the_targets_own_draws() {
        let rows: Vec<Vec<f32>> = (0..4).map(|i| vec![0.3 * i as f32, 0.5, 0.1, 0.4, -0.2]).collect();
        let params = SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        };
        let s = Sampler::new(Some(3));
        for position in 10..60 {
            let own: Vec<u32> = (0..4).map(|i| s.sample(&rows[i], &params, position + i)).collect();
            let all = verify(&own[..3], &rows, None, &params, &s, position);
            assert_eq!((all.accepted, &all.tokens), (3, &own));
            for wrong_at in 0..3 {
                let mut drafts = own[..3].to_vec();
                drafts[wrong_at] = (drafts[wrong_at] + 1) % 5;
                let v = verify(&drafts, &rows, None, &params, &s, position);
                assert_eq!(v.accepted, wrong_at);
                assert_eq!(v.tokens, own[..=wrong_at]);
            }
        }
    }
}

//! Verification of drafts against the target's logits for the window `[b, d1..dK]`.
//!
//! Row i of the window's logits is the target's distribution for the token after `d_i` (row 0:
//! after `b`). Greedy keeps the longest prefix of drafts equal to the target's argmax and then
//! emits the target's own token. With temperature, rejection sampling (Leviathan et al. 2023)
//! accepts `d_i` with probability min(1, p(d_i) / q(d_i)) and on rejection draws from
//! normalize(max(0, p - q)), which makes the output distributed exactly as the target's.

use crate::sampler::{argmax, Sampler, SamplingParams};

/// What one verification commits: `accepted` drafts followed by one target token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub accepted: usize,
    pub tokens: Vec<u32>,
}

/// `logits` has one row per window position (drafts.len() + 1 rows). `draft_probs`, when
/// given, holds the drafter's distribution q for each draft; without it drafts count as
/// greedy picks (q one-hot).
pub fn verify(
    drafts: &[u32],
    logits: &[Vec<f32>],
    draft_probs: Option<&[Vec<f32>]>,
    params: &SamplingParams,
    sampler: &mut Sampler,
) -> Verdict {
    assert_eq!(logits.len(), drafts.len() + 1, "one logits row per window position");
    if params.is_greedy() {
        return verify_greedy(drafts, logits);
    }
    for (i, &d) in drafts.iter().enumerate() {
        let p = params.probabilities(&logits[i]);
        let q_d = draft_probs.map_or(1.0, |q| q[i][d as usize]);
        let accept = if q_d <= 0.0 {
            1.0
        } else {
            (p[d as usize] / q_d).min(1.0)
        };
        if sampler.uniform() < accept as f64 {
            continue;
        }
        let residual: Vec<f32> = match draft_probs {
            Some(q) => p.iter().zip(&q[i]).map(|(p, q)| (p - q).max(0.0)).collect(),
            None => {
                let mut r = p.clone();
                r[d as usize] = 0.0;
                r
            }
        };
        // p == q leaves no residual mass, but then the draft was accepted with probability 1.
        let token = if residual.iter().any(|r| *r > 0.0) {
            sampler.draw(&residual)
        } else {
            sampler.draw(&p)
        };
        return commit(drafts, i, token as u32);
    }
    let bonus = sampler.draw(&params.probabilities(&logits[drafts.len()]));
    commit(drafts, drafts.len(), bonus as u32)
}

fn verify_greedy(drafts: &[u32], logits: &[Vec<f32>]) -> Verdict {
    let mut accepted = 0;
    while accepted < drafts.len() && argmax(&logits[accepted]) as u32 == drafts[accepted] {
        accepted += 1;
    }
    commit(drafts, accepted, argmax(&logits[accepted]) as u32)
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
        let mut s = Sampler::new(Some(0));
        let g = SamplingParams::default();
        let v = verify(&[3, 5, 2], &logits, None, &g, &mut s);
        assert_eq!(
            v,
            Verdict {
                accepted: 2,
                tokens: vec![3, 5, 1]
            }
        );
        let v = verify(&[3, 5, 1], &logits, None, &g, &mut s);
        assert_eq!(
            v,
            Verdict {
                accepted: 3,
                tokens: vec![3, 5, 1, 7]
            },
            "bonus token after all accepted"
        );
        let v = verify(&[4, 5, 1], &logits, None, &g, &mut s);
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                tokens: vec![3]
            }
        );
        let v = verify(&[], &logits[..1], None, &g, &mut s);
        assert_eq!(
            v,
            Verdict {
                accepted: 0,
                tokens: vec![3]
            },
            "no drafts is plain decoding"
        );
    }
}

//! Rejection sampling reproduces the target distribution whatever the drafter proposes:
//! chi-square goodness of fit over many seeded draws.

use peagle_engine::sampler::draw;
use peagle_engine::verifier::verify;
use peagle_engine::{Sampler, SamplingParams};
use rand::rngs::StdRng;
use rand::SeedableRng;

const TRIALS: usize = 40_000;
/// Chi-square critical value at significance 0.001 for up to 5 degrees of freedom.
const CRITICAL: [f64; 6] = [0.0, 10.83, 13.82, 16.27, 18.47, 20.52];

fn params(temperature: f32, top_k: usize) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p: 1.0,
        ..SamplingParams::default()
    }
}

/// Distribution of the first committed token over `TRIALS` verifications of one draft.
fn first_token_counts(target: &[f32], q: Option<&[f32]>, fixed_draft: u32, p: &SamplingParams) -> Vec<usize> {
    let sampler = Sampler::new(Some(11));
    let mut draft_rng = StdRng::seed_from_u64(12);
    let mut counts = vec![0; target.len()];
    let logits = vec![target.to_vec(), target.to_vec()];
    for trial in 0..TRIALS {
        let draft = q.map_or(fixed_draft, |q| draw(&mut draft_rng, q) as u32);
        let q_rows = q.map(|q| vec![q.to_vec()]);
        // Two positions per trial: the draft's and the bonus token's.
        let v = verify(&[draft], &logits, q_rows.as_deref(), p, &sampler, 2 * trial);
        counts[v.tokens[0] as usize] += 1;
    }
    counts
}

fn assert_fits(counts: &[usize], expected: &[f32]) {
    let mut chi2 = 0.0;
    let mut categories = 0;
    for (c, e) in counts.iter().zip(expected) {
        let e = *e as f64 * TRIALS as f64;
        if e == 0.0 {
            assert_eq!(*c, 0, "a token outside the target's support was emitted");
            continue;
        }
        chi2 += (*c as f64 - e).powi(2) / e;
        categories += 1;
    }
    assert!(
        chi2 < CRITICAL[categories - 1],
        "chi2 {chi2:.2} over {categories} categories: {counts:?} vs {expected:?}"
    );
}

const TARGET: [f32; 6] = [1.2, 0.3, -0.5, 2.0, 0.0, -1.0];
const DRAFT_Q: [f32; 6] = [0.05, 0.4, 0.3, 0.05, 0.1, 0.1];

#[test]
fn sampled_drafts_from_a_different_distribution() {
    let p = params(1.0, 0);
    assert_fits(
        &first_token_counts(&TARGET, Some(&DRAFT_Q), 0, &p),
        &p.probabilities(&TARGET),
    );
}

#[test]
fn greedy_drafts_with_one_hot_q() {
    let p = params(1.0, 0);
    for draft in [3, 5] {
        assert_fits(&first_token_counts(&TARGET, None, draft, &p), &p.probabilities(&TARGET));
    }
}

#[test]
fn temperature_and_top_k_shape_the_target() {
    let p = params(0.7, 4);
    let expected = p.probabilities(&TARGET);
    assert_eq!(expected.iter().filter(|x| **x > 0.0).count(), 4);
    assert_fits(&first_token_counts(&TARGET, Some(&DRAFT_Q), 0, &p), &expected);
}

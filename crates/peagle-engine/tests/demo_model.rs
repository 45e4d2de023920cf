//! The bundled demo model (models/pystdlib-12l) continues held-out prompts exactly as
//! transformers does (64 greedy tokens each, references made by scripts/train_demo_model.py),
//! and its trained drafters leave that output unchanged.

use peagle_engine::{DraftModel, GenerateParams, SamplingParams, SpecStats};
use peagle_models::LoadOptions;
mod common;
use common::{demo, eval_prompts, repo};

#[derive(serde::Deserialize)]
struct Reference {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
}

#[test]
fn greedy_continuations_equal_transformers() {
    let refs: Vec<Reference> =
        serde_json::from_str(&std::fs::read_to_string(repo("tests/fixtures/demo_greedy.json")).unwrap()).unwrap();
    assert_eq!(refs.len(), 3);
    let mut g = demo(&LoadOptions::default(), None);
    let params = GenerateParams {
        max_tokens: 64,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..GenerateParams::default()
    };
    for r in &refs {
        let ids = g
            .tokenizer()
            .unwrap()
            .encode(r.prompt.as_str(), true)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(ids, r.prompt_ids, "the Rust tokenizer must agree with the Python one");
        let out = g.generate(&r.prompt_ids, &params, |_| {}).unwrap();
        assert_eq!(out.token_ids, r.greedy_ids, "prompt {:?}", r.prompt);
    }
}

/// The committed demo drafters and whether each drafts in parallel (P-EAGLE).
const DRAFTERS: [(&str, bool); 2] = [("pystdlib-12l-peagle", true), ("pystdlib-12l-eagle3", false)];

/// The first `n` eval prompts and the demo model's output for each without a drafter.
fn plain_outputs(n: usize, params: &GenerateParams) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let mut plain = demo(&LoadOptions::default(), None);
    let prompts = eval_prompts(&plain, n);
    let want = prompts
        .iter()
        .map(|p| plain.generate(p, params, |_| {}).unwrap().token_ids)
        .collect();
    (prompts, want)
}

/// Generates every prompt with `drafter` at K = `k`, asserting each output equals the plain
/// one; returns the acceptance counts.
fn generate_as_plain(
    drafter: &str,
    parallel: bool,
    k: usize,
    prompts: &[Vec<u32>],
    want: &[Vec<u32>],
    params: &GenerateParams,
) -> SpecStats {
    let mut g = demo(
        &LoadOptions::default(),
        Some(DraftModel {
            dir: repo(&format!("models/{drafter}")),
            k: Some(k),
            parallel,
        }),
    );
    let mut stats = SpecStats::default();
    for (prompt, want) in prompts.iter().zip(want) {
        let out = g.generate(prompt, params, |_| {}).unwrap();
        assert_eq!(&out.token_ids, want, "{drafter} at K = {k}");
        stats.merge(&out.spec_stats);
    }
    stats
}

/// The committed trained drafters change nothing in greedy output, token for token, on 20
/// held-out prompts at K = 1, 3 and 7, and get a third of their first drafts accepted (a
/// random drafter's acceptance length is about 1 + 1/vocab; the drafters' cards give theirs).
#[test]
fn trained_drafters_keep_greedy_output_exact() {
    let params = GenerateParams {
        max_tokens: 32,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let (prompts, want) = plain_outputs(20, &params);
    for (drafter, parallel) in DRAFTERS {
        for k in [1, 3, 7] {
            let stats = generate_as_plain(drafter, parallel, k, &prompts, &want, &params);
            let accepted = stats.mean_acceptance_length();
            assert!(accepted > 1.3, "{drafter} at K = {k}: acceptance length {accepted}");
        }
    }
}

/// Seeded sampling gives the same tokens with and without drafts: every position's draw is
/// keyed by the seed and the position, and a draft is kept only when it equals that draw.
#[test]
fn seeded_sampling_is_the_same_with_either_drafter() {
    let params = GenerateParams {
        max_tokens: 48,
        sampling: SamplingParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: Some(2024),
            ..SamplingParams::default()
        },
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let (prompts, want) = plain_outputs(4, &params);
    for (drafter, parallel) in DRAFTERS {
        let stats = generate_as_plain(drafter, parallel, 3, &prompts, &want, &params);
        assert!(stats.num_accepted_tokens > 0, "{drafter}: {stats:?}");
    }
}

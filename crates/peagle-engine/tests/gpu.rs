//! The demo model and its drafters on a GPU: greedy output with either drafter, at K = 1, 3
//! and 7, equals greedy output without one, token for token. Built with the `cuda` feature only
//! and run by scripts/gpu_check.sh; without a GPU the test says so and passes.
#![cfg(feature = "cuda")]

use peagle_engine::{DraftModel, GenerateParams, SamplingParams, SpecStats};
use peagle_models::{DTypeSpec, DeviceSpec, LoadOptions};
mod common;
use common::{demo, eval_prompts, repo};

#[test]
fn speculative_greedy_output_equals_plain_on_the_gpu() {
    let options = match LoadOptions::place(DeviceSpec::Cuda(0), DTypeSpec::Auto) {
        Ok(options) => options,
        Err(e) => return eprintln!("skipped: {e}"),
    };
    let params = GenerateParams {
        max_tokens: 48,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let mut plain = demo(&options, None);
    let prompts = eval_prompts(&plain, 20);
    let want: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| plain.generate(p, &params, |_| {}).unwrap().token_ids)
        .collect();

    // How far bf16 on the GPU follows f32 on the CPU: reported, not asserted (near-ties of
    // the two precisions may pick different tokens).
    let mut cpu = demo(&LoadOptions::default(), None);
    let agree: usize = prompts
        .iter()
        .zip(&want)
        .map(|(p, w)| {
            let c = cpu.generate(p, &params, |_| {}).unwrap().token_ids;
            c.iter().zip(w).take_while(|(a, b)| a == b).count()
        })
        .sum();
    eprintln!(
        "GPU bf16 and CPU f32 greedy outputs agree on {agree} of {} leading tokens",
        want.len() * params.max_tokens
    );

    for (drafter, parallel) in [("pystdlib-12l-peagle", true), ("pystdlib-12l-eagle3", false)] {
        for k in [1, 3, 7] {
            let mut g = demo(
                &options,
                Some(DraftModel {
                    dir: repo(&format!("models/{drafter}")),
                    k: Some(k),
                    parallel,
                }),
            );
            let mut stats = SpecStats::default();
            for (prompt, want) in prompts.iter().zip(&want) {
                let out = g.generate(prompt, &params, |_| {}).unwrap();
                assert_eq!(&out.token_ids, want, "{drafter} at K = {k}");
                stats.merge(&out.spec_stats);
            }
            let accepted = stats.mean_acceptance_length();
            eprintln!("{drafter} K = {k}: acceptance length {accepted:.2} on the GPU");
            assert!(accepted > 1.3, "{drafter} at K = {k}: acceptance length {accepted}");
        }
    }
}

//! A step's sampling and verification at gpt-oss's vocabulary (201,088 tokens) over 64 logits
//! rows: 16 sequences, each verifying a window of its last token and 3 drafts, from the logits
//! tensor as the target's forward returns it (f32, on the CPU). Greedy; temperature 0.8 with
//! top-p 0.95; temperature 0.8 with top-k 50.
//!
//! The logits are Gaussian with a standard deviation of 3 (fixed seed): at temperature 0.8
//! the top-p 0.95 nucleus then holds a few thousand tokens. Each sequence's drafts are the
//! tokens the target itself chooses, so every draft is accepted and all 64 rows are read.

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};
use peagle_engine::{rejection_sample, GenerateParams, SamplingParams, Sequence, Verified, Window};
use std::hint::black_box;

const VOCAB: usize = 201_088;
const SEQUENCES: usize = 16;
const DRAFTS: usize = 3;
const WINDOW: usize = DRAFTS + 1;
const PROMPT: usize = 32;
const SPREAD: f32 = 3.0;

/// [SEQUENCES * WINDOW, VOCAB] Gaussian logits (Box-Muller over a fixed LCG stream).
fn logits() -> Tensor {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut uniform = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let values: Vec<f32> = (0..SEQUENCES * WINDOW * VOCAB)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            (SPREAD as f64 * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
        })
        .collect();
    Tensor::from_vec(values, (SEQUENCES * WINDOW, VOCAB), &Device::Cpu).unwrap()
}

/// The 16 sequences after a 32-token prompt, each with the drafts its window's rows choose.
fn sequences(sampling: &SamplingParams, logits: &Tensor) -> Vec<Sequence> {
    let rows: Vec<Vec<f32>> = logits.to_vec2().unwrap();
    (0..SEQUENCES)
        .map(|s| {
            let params = GenerateParams {
                max_tokens: 1024,
                sampling: SamplingParams {
                    seed: Some(s as u64),
                    ..sampling.clone()
                },
                ..GenerateParams::default()
            };
            let mut seq = Sequence::new((0..PROMPT as u32).collect(), params);
            seq.drafts = (0..DRAFTS)
                .map(|i| {
                    seq.sampler
                        .sample(&rows[s * WINDOW + i], &seq.params.sampling, PROMPT + i)
                })
                .collect();
            seq
        })
        .collect()
}

/// What a step does with its logits for these sequences: each window's verdict.
fn sample_step(logits: &Tensor, seqs: &[Sequence]) -> Vec<Verified> {
    let windows: Vec<Window> = seqs
        .iter()
        .enumerate()
        .map(|(s, seq)| Window {
            first_row: s * WINDOW,
            drafts: &seq.drafts,
            position: seq.len(),
            seq,
        })
        .collect();
    rejection_sample(logits, &windows, &[]).unwrap()
}

fn sampling(c: &mut Criterion) {
    let logits = logits();
    let cases = [
        ("greedy", SamplingParams::default()),
        (
            "temperature 0.8, top_p 0.95",
            SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                ..SamplingParams::default()
            },
        ),
        (
            "temperature 0.8, top_k 50",
            SamplingParams {
                temperature: 0.8,
                top_k: 50,
                ..SamplingParams::default()
            },
        ),
    ];
    let mut g = c.benchmark_group(format!(
        "sampling step, {SEQUENCES} sequences x {WINDOW} rows, vocab {VOCAB}"
    ));
    g.sample_size(10);
    for (name, params) in cases {
        let seqs = sequences(&params, &logits);
        let verdicts = sample_step(&logits, &seqs);
        assert!(
            verdicts.iter().all(|v| v.verdict.accepted == DRAFTS),
            "{name}: every draft is accepted"
        );
        g.bench_function(name, |b| b.iter(|| black_box(sample_step(&logits, &seqs))));
    }
    g.finish();
}

criterion_group!(benches, sampling);
criterion_main!(benches);

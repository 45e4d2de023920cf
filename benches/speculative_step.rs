//! The parts of one speculative step on the bundled demo model and its trained drafters, after
//! a 128-token context: the target's decode step (what one plain token costs), and at K = 3
//! and 7 its K+1-row verification, one P-EAGLE drafter pass for K drafts and the K passes
//! EAGLE-3 needs (each through its proposer, greedy draft ids included).
//!
//! The same parts again for copies of the three models widened to hidden size 1024 with
//! random weights (`widened_copy`): a 320 MB target, far larger than this CPU's caches, so
//! that a step is bound by reading the weights as on a GPU, which the demo model (23 MB) is
//! not. Their drafts are noise; the parts' costs are what they measure.

use candle_core::{DType, Tensor};
use criterion::{criterion_group, Criterion};
use peagle_benches::{widened_copy, WIDE_HIDDEN};
use peagle_engine::proposer::{DraftRequest, DrafterPasses, Eagle3Proposer, PEagleProposer, Proposer};
use peagle_models::{load_target, BatchBuilder, DraftHidden, Drafter, KvCache, LoadOptions, Rows, TargetModel};
use std::hint::black_box;
use std::path::{Path, PathBuf};

const BLOCK: usize = 16;
const CONTEXT: usize = 128;
const K: usize = 7;
/// Drafts accepted in the previous step: the P-EAGLE query is these, the bonus token and K-1
/// mask slots.
const ACCEPTED: usize = 3;
/// The demo target and its drafters, by directory name under `models/`.
const MODELS: [&str; 3] = ["pystdlib-12l", "pystdlib-12l-peagle", "pystdlib-12l-eagle3"];

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

struct Setup {
    target: Box<dyn TargetModel>,
    target_kv: KvCache,
    tokens: Vec<u32>,
    /// Captured states of every context position, [CONTEXT + K + 1, aux width].
    aux: Tensor,
}

/// One forward of `rows` tokens from `start`, logits for the last `logits` rows.
fn batch(tokens: &[u32], start: usize, logits: usize) -> peagle_models::ForwardBatch {
    let table: Vec<u32> = (0..16).collect();
    let mut b = BatchBuilder::new(BLOCK);
    b.add(tokens, start, &table, Rows::Tail(logits), Rows::All).unwrap();
    b.build()
}

fn setup(models: &Path) -> Setup {
    let target = load_target(&models.join(MODELS[0]), LoadOptions::default())
        .unwrap()
        .model;
    // The cache the demo model is served with (auto: bf16, as its weights).
    let target_kv = KvCache::new(target.dims(), 16, BLOCK, DType::BF16, target.device()).unwrap();
    let tokens: Vec<u32> = (0..(CONTEXT + K + 1) as u32).map(|t| (t * 37) % 8000 + 1).collect();
    let out = target.forward(&batch(&tokens, 0, 1), &target_kv).unwrap();
    Setup {
        aux: out.aux_hidden.unwrap(),
        target,
        target_kv,
        tokens,
    }
}

fn drafter(setup: &Setup, dir: &Path) -> (Drafter, KvCache) {
    let drafter = Drafter::load(dir, setup.target.as_ref(), LoadOptions::default()).unwrap();
    let kv = KvCache::new(drafter.dims(), 16, BLOCK, DType::BF16, drafter.device()).unwrap();
    // The drafter's cache holds the context, as after prefill.
    let context = batch(&setup.tokens[1..=CONTEXT], 0, 1);
    let hidden = DraftHidden::Target(setup.aux.narrow(0, 0, CONTEXT).unwrap());
    drafter.forward(&context, &hidden, &kv).unwrap();
    (drafter, kv)
}

fn speculative_step(c: &mut Criterion) {
    let demo = repo("models");
    step_parts(c, "demo model", &demo);
    let wide = tempfile::tempdir().unwrap();
    for name in MODELS {
        widened_copy(&demo.join(name), &wide.path().join(name), WIDE_HIDDEN);
    }
    step_parts(c, "hidden 1024, random weights", wide.path());
}

/// The parts of a step for the target and drafters named `MODELS` in `models`.
fn step_parts(c: &mut Criterion, label: &str, models: &Path) {
    let s = setup(models);
    let mut g = c.benchmark_group(format!("{label}, speculative step parts"));
    g.bench_function("target decode step (1 row)", |b| {
        b.iter(|| {
            black_box(
                s.target
                    .forward(&batch(&s.tokens[CONTEXT..CONTEXT + 1], CONTEXT, 1), &s.target_kv),
            )
        })
    });

    // The proposers as the engine runs them: the previous step accepted ACCEPTED drafts, so
    // the request's slots are those and the bonus token, with the target states before them,
    // which each drafter projects first (the engine does so with the target's forward).
    let start = CONTEXT - ACCEPTED;
    let table: Vec<u32> = (0..16).collect();
    let states = s.aux.narrow(0, start, ACCEPTED + 1).unwrap();
    let request = DraftRequest {
        tokens: &s.tokens[start + 1..=CONTEXT + 1],
        start,
        states: 0..ACCEPTED + 1,
        block_table: &table,
        draft: true,
    };
    let (peagle, peagle_kv) = drafter(&s, &models.join(MODELS[1]));
    let mut peagle = PEagleProposer::new(DrafterPasses::new(peagle, peagle_kv, None), K).unwrap();
    let (eagle3, eagle3_kv) = drafter(&s, &models.join(MODELS[2]));
    let mut eagle3 = Eagle3Proposer::new(DrafterPasses::new(eagle3, eagle3_kv, None), K);
    for k in [3, K] {
        g.bench_function(format!("target verification (K+1 = {} rows)", k + 1), |b| {
            let window = &s.tokens[CONTEXT..CONTEXT + k + 1];
            b.iter(|| black_box(s.target.forward(&batch(window, CONTEXT, k + 1), &s.target_kv)))
        });
        g.bench_function(format!("P-EAGLE drafter, K = {k} in one pass"), |b| {
            b.iter(|| {
                let projected = peagle.project(&states).unwrap();
                black_box(peagle.propose(&projected, std::slice::from_ref(&request), k).unwrap())
            })
        });
        g.bench_function(format!("EAGLE-3 drafter, K = {k} in {k} passes"), |b| {
            b.iter(|| {
                let projected = eagle3.project(&states).unwrap();
                black_box(eagle3.propose(&projected, std::slice::from_ref(&request), k).unwrap())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, speculative_step);
peagle_benches::main_on_pool!(benches);

//! One decode step (1 row) against one 8-row verification window and a decode step of 16
//! sequences, at the demo model's size, after a 128-token context, over the bf16 KV cache the
//! demo model is served with; the 16 sequences also over an f32 cache. The 1-row step and the
//! 16 sequences also run capturing the hidden states a drafter reads, as every step of a
//! server with a drafter does, drafting or not. A prefill of 16 prompts of 32 tokens. The
//! 1-row and 16-sequence steps again at hidden size 1024, where reading the weights bounds a
//! step. And the machine's memory read bandwidth for the roofline.

use candle_core::DType;
use criterion::{criterion_group, Criterion, Throughput};
use peagle_benches::{demo_config, random_model, weight_bytes, DEMO_HIDDEN, WIDE_HIDDEN};
use peagle_models::{BatchBuilder, ForwardOutput, KvCache, Rows, TargetModel};
use std::hint::black_box;

const BLOCK: usize = 16;
const CONTEXT: usize = 128;

/// A model with a 128-token context in one sequence's cache and in each of 16 sequences'.
struct Setup {
    model: Box<dyn TargetModel>,
    kv: KvCache,
    kv16: KvCache,
    kv16_f32: KvCache,
    tokens: Vec<u32>,
    table: Vec<u32>,
    tables: Vec<Vec<u32>>,
}

impl Setup {
    fn new(config: &str) -> Self {
        let model = random_model(config);
        let cache = |seqs: usize, dtype| KvCache::new(model.dims(), 16 * seqs, BLOCK, dtype, model.device()).unwrap();
        let setup = Self {
            kv: cache(1, DType::BF16),
            kv16: cache(16, DType::BF16),
            kv16_f32: cache(16, DType::F32),
            tokens: (0..CONTEXT as u32 + 8).map(|t| (t * 37) % 8192).collect(),
            table: (0..16).collect(),
            tables: (0..16u32).map(|s| (16 * s..16 * s + 16).collect()).collect(),
            model,
        };
        setup.forward(0, CONTEXT, Rows::None);
        setup.batch(&setup.kv16, 0, CONTEXT, Rows::None);
        setup.batch(&setup.kv16_f32, 0, CONTEXT, Rows::None);
        setup
    }

    /// `rows` tokens of the one sequence from `start`.
    fn forward(&self, start: usize, rows: usize, capture: Rows) -> ForwardOutput {
        let mut b = BatchBuilder::new(BLOCK);
        b.add(
            &self.tokens[start..start + rows],
            start,
            &self.table,
            Rows::All,
            capture,
        )
        .unwrap();
        self.model.forward(&b.build(), &self.kv).unwrap()
    }

    /// `rows` tokens from `start` of each of the 16 sequences, each with its own context.
    fn batch(&self, kv: &KvCache, start: usize, rows: usize, capture: Rows) -> ForwardOutput {
        let mut b = BatchBuilder::new(BLOCK);
        for table in &self.tables {
            b.add(&self.tokens[start..start + rows], start, table, Rows::All, capture)
                .unwrap();
        }
        self.model.forward(&b.build(), kv).unwrap()
    }
}

fn decode(c: &mut Criterion) {
    let config = demo_config(DEMO_HIDDEN);
    let s = Setup::new(&config);
    let mut g = c.benchmark_group("demo-size target forward");
    g.throughput(Throughput::Bytes(weight_bytes(&config) as u64));
    g.bench_function("decode step (1 row)", |b| {
        b.iter(|| black_box(s.forward(CONTEXT, 1, Rows::None)))
    });
    g.bench_function("decode step (1 row), capturing drafter states", |b| {
        b.iter(|| black_box(s.forward(CONTEXT, 1, Rows::All)))
    });
    g.bench_function("verification window (8 rows)", |b| {
        b.iter(|| black_box(s.forward(CONTEXT, 8, Rows::None)))
    });
    g.bench_function("decode step of 16 sequences", |b| {
        b.iter(|| black_box(s.batch(&s.kv16, CONTEXT, 1, Rows::None)))
    });
    g.bench_function("decode step of 16 sequences, f32 cache", |b| {
        b.iter(|| black_box(s.batch(&s.kv16_f32, CONTEXT, 1, Rows::None)))
    });
    g.bench_function("decode step of 16 sequences, capturing drafter states", |b| {
        b.iter(|| black_box(s.batch(&s.kv16, CONTEXT, 1, Rows::All)))
    });
    g.bench_function("prefill of 16 prompts of 32 tokens", |b| {
        b.iter(|| black_box(s.batch(&s.kv16, 0, 32, Rows::None)))
    });
    g.finish();
    drop(s);

    // A target bound by reading its weights, as on a GPU: what batching gains there.
    let config = demo_config(WIDE_HIDDEN);
    let s = Setup::new(&config);
    let mut g = c.benchmark_group("hidden-1024 target forward");
    g.throughput(Throughput::Bytes(weight_bytes(&config) as u64));
    g.bench_function("decode step (1 row)", |b| {
        b.iter(|| black_box(s.forward(CONTEXT, 1, Rows::None)))
    });
    g.bench_function("decode step of 16 sequences", |b| {
        b.iter(|| black_box(s.batch(&s.kv16, CONTEXT, 1, Rows::None)))
    });
    g.finish();
    drop(s);

    // Read bandwidth over a buffer far larger than the caches, on all cores as the matmul
    // runs: the decode step's floor is weight bytes / this.
    let buf = vec![1.0f32; 64 << 20];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut g = c.benchmark_group("memory");
    g.throughput(Throughput::Bytes((buf.len() * 4) as u64));
    g.bench_function("read 256 MiB", |b| b.iter(|| black_box(parallel_sum(&buf, threads))));
    g.finish();
}

fn parallel_sum(buf: &[f32], threads: usize) -> f32 {
    std::thread::scope(|s| {
        let parts: Vec<_> = buf
            .chunks(buf.len().div_ceil(threads))
            .map(|part| s.spawn(move || lane_sum(part)))
            .collect();
        parts.into_iter().map(|p| p.join().unwrap()).sum()
    })
}

/// 16 independent lanes so the loop vectorises and is bound by memory, not by add latency.
fn lane_sum(part: &[f32]) -> f32 {
    let acc = part.chunks_exact(16).fold([0f32; 16], |mut acc, c| {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
        acc
    });
    acc.iter().sum()
}

criterion_group!(benches, decode);
peagle_benches::main_on_pool!(benches);

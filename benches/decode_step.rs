//! One decode step (1 row) against one 8-row verification window and a decode step of 16
//! sequences, at the demo model's size, after a 128-token context, over the bf16 KV cache the
//! demo model is served with; the 16 sequences also over an f32 cache. The 1-row step and the
//! 16 sequences also run capturing the hidden states a drafter reads, as every step of a
//! server with a drafter does, drafting or not. A prefill of 16 prompts of 32 tokens, and the
//! machine's memory read bandwidth for the roofline.

use candle_core::DType;
use criterion::{criterion_group, Criterion, Throughput};
use peagle_benches::{random_model, weight_bytes, DEMO_CONFIG};
use peagle_models::{BatchBuilder, KvCache, Rows};
use std::hint::black_box;

const BLOCK: usize = 16;
const CONTEXT: usize = 128;

fn decode(c: &mut Criterion) {
    let model = random_model(DEMO_CONFIG);
    let kv = KvCache::new(model.dims(), 16, BLOCK, DType::BF16, model.device()).unwrap();
    let table: Vec<u32> = (0..16).collect();
    let tokens: Vec<u32> = (0..CONTEXT as u32 + 8).map(|t| (t * 37) % 8192).collect();
    let forward_capturing = |start: usize, rows: usize, capture: Rows| {
        let mut b = BatchBuilder::new(BLOCK);
        b.add(&tokens[start..start + rows], start, &table, Rows::All, capture)
            .unwrap();
        model.forward(&b.build(), &kv).unwrap()
    };
    let forward = |start: usize, rows: usize| forward_capturing(start, rows, Rows::None);
    forward(0, CONTEXT);

    // A decode step of a batch: one row for each of 16 sequences, each with its own context.
    let cache16 = |dtype| KvCache::new(model.dims(), 16 * 16, BLOCK, dtype, model.device()).unwrap();
    let (kv16, kv16_f32) = (cache16(DType::BF16), cache16(DType::F32));
    let tables: Vec<Vec<u32>> = (0..16u32).map(|s| (16 * s..16 * s + 16).collect()).collect();
    let batch = |kv: &KvCache, start: usize, rows: usize, capture: Rows| {
        let mut b = BatchBuilder::new(BLOCK);
        for table in &tables {
            b.add(&tokens[start..start + rows], start, table, Rows::All, capture)
                .unwrap();
        }
        model.forward(&b.build(), kv).unwrap()
    };
    batch(&kv16, 0, CONTEXT, Rows::None);
    batch(&kv16_f32, 0, CONTEXT, Rows::None);

    let mut g = c.benchmark_group("demo-size target forward");
    g.throughput(Throughput::Bytes(weight_bytes(DEMO_CONFIG) as u64));
    g.bench_function("decode step (1 row)", |b| b.iter(|| black_box(forward(CONTEXT, 1))));
    g.bench_function("decode step (1 row), capturing drafter states", |b| {
        b.iter(|| black_box(forward_capturing(CONTEXT, 1, Rows::All)))
    });
    g.bench_function("verification window (8 rows)", |b| {
        b.iter(|| black_box(forward(CONTEXT, 8)))
    });
    g.bench_function("decode step of 16 sequences", |b| {
        b.iter(|| black_box(batch(&kv16, CONTEXT, 1, Rows::None)))
    });
    g.bench_function("decode step of 16 sequences, f32 cache", |b| {
        b.iter(|| black_box(batch(&kv16_f32, CONTEXT, 1, Rows::None)))
    });
    g.bench_function("decode step of 16 sequences, capturing drafter states", |b| {
        b.iter(|| black_box(batch(&kv16, CONTEXT, 1, Rows::All)))
    });
    g.bench_function("prefill of 16 prompts of 32 tokens", |b| {
        b.iter(|| black_box(batch(&kv16, 0, 32, Rows::None)))
    });
    g.finish();

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

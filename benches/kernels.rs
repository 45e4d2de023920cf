//! The hot ops alone, at the demo model's sizes: the small-row matmul at 1, 4, 8 and 16 rows
//! (decode, verification windows, batches) and paged attention for a decode row and an 8-row
//! window over a 512-token context.

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, BenchmarkId, Criterion};
use peagle_kernels::{linear, paged_attention, AttentionMetadata, AttentionParams, PackedWeight};
use std::hint::black_box;

fn matmul(c: &mut Criterion) {
    let dev = Device::Cpu;
    for (name, n, k) in [
        ("qkv 512x256", 512, 256),
        ("mlp down 256x768", 256, 768),
        ("mlp gate_up 1536x256", 1536, 256),
        ("lm_head 8192x256", 8192, 256),
    ] {
        let w = Tensor::randn(0f32, 0.05, (n, k), &dev)
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let packed = PackedWeight::new(&w).unwrap();
        let mut g = c.benchmark_group(format!("linear {name} bf16"));
        for rows in [1, 4, 8, 16] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &dev).unwrap();
            g.bench_with_input(BenchmarkId::from_parameter(rows), &x, |b, x| {
                b.iter(|| black_box(linear(x, &packed).unwrap()))
            });
        }
        g.finish();
    }
}

fn attention(c: &mut Criterion) {
    let dev = Device::Cpu;
    let (heads, kv_heads, d, block, ctx) = (4, 2, 64, 16, 512);
    let params = AttentionParams {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: d,
        scale: 0.125,
        sliding_window: None,
    };
    let k = Tensor::randn(0f32, 1.0, (ctx + 16, kv_heads * d), &dev).unwrap();
    let v = Tensor::randn(0f32, 1.0, (ctx + 16, kv_heads * d), &dev).unwrap();
    let mut g = c.benchmark_group("paged attention, 512-token context");
    for rows in [1, 8] {
        let q = Tensor::randn(0f32, 1.0, (rows, heads * d), &dev).unwrap();
        let meta = AttentionMetadata {
            block_size: block,
            query_start: vec![0, rows],
            context_lens: vec![ctx],
            block_tables: vec![(0..(ctx / block) as u32).rev().collect()],
            slot_mapping: (ctx - rows..ctx).map(|p| p as u32).collect(),
        };
        g.bench_with_input(BenchmarkId::from_parameter(rows), &q, |b, q| {
            b.iter(|| black_box(paged_attention(q, &k, &v, &meta, &params).unwrap()))
        });
    }
    g.finish();
}

criterion_group!(benches, matmul, attention);
peagle_benches::main_on_pool!(benches);

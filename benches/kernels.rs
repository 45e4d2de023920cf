//! The hot ops alone, at the demo model's sizes: the small-row matmul at 1, 4, 8 and 16 rows
//! (decode, verification windows, batches) and paged attention for a decode row, an 8-row
//! window and 16 sequences' decode rows over 512-token contexts, with f32 and bf16 caches; and
//! at gpt-oss-20b's, one expert's MXFP4 projections at 1 and 8 rows.

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, BenchmarkId, Criterion};
use peagle_kernels::{
    linear, mxfp4_linear, paged_attention, AttentionMetadata, AttentionParams, Mxfp4Weight, PackedWeight,
};
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

/// One gpt-oss-20b expert's gate/up (5760 x 2880) and down (2880 x 2880) projections, with
/// random codes and scales near 2^0, for a decode row, a verification window's 8 and a
/// prefill chunk's share of 32.
fn mxfp4(c: &mut Criterion) {
    let dev = Device::Cpu;
    for (name, n, k) in [("gate_up 5760x2880", 5760, 2880), ("down 2880x2880", 2880, 2880)] {
        let groups = k / 32;
        let codes: Vec<u8> = (0..n * groups * 16)
            .map(|i| ((i * 2654435761usize) >> 13) as u8)
            .collect();
        let scales: Vec<u8> = (0..n * groups).map(|i| 120 + (i % 11) as u8).collect();
        let w = Mxfp4Weight::new(
            &Tensor::from_vec(codes, (n, groups, 16), &dev).unwrap(),
            &Tensor::from_vec(scales, (n, groups), &dev).unwrap(),
        )
        .unwrap();
        let mut g = c.benchmark_group(format!("mxfp4 expert {name}"));
        for rows in [1, 8, 32] {
            let x = Tensor::randn(0f32, 1.0, (rows, k), &dev).unwrap();
            g.bench_with_input(BenchmarkId::from_parameter(rows), &x, |b, x| {
                b.iter(|| black_box(mxfp4_linear(x, &w).unwrap()))
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
        kv_scale: peagle_kernels::KvScale::ONE,
    };
    // Room for 16 sequences' contexts, each in its own blocks.
    let slots = 16 * ctx;
    let blocks = |s: usize| -> Vec<u32> {
        (0..(ctx / block) as u32)
            .rev()
            .map(|b| b + (s * ctx / block) as u32)
            .collect()
    };
    for dtype in [DType::F32, DType::BF16, DType::F8E4M3] {
        let cache = || Tensor::randn(0f32, 1.0, (slots, kv_heads * d), &dev)?.to_dtype(dtype);
        let (k, v) = (cache().unwrap(), cache().unwrap());
        let mut g = c.benchmark_group(format!("paged attention, 512-token context, {dtype:?} cache"));
        // One decode row, an 8-row verification window, and a decode row of each of 16 sequences.
        for (name, seqs, rows) in [("1 row", 1, 1), ("8-row window", 1, 8), ("16 sequences", 16, 1)] {
            let q = Tensor::randn(0f32, 1.0, (seqs * rows, heads * d), &dev).unwrap();
            let meta = AttentionMetadata {
                block_size: block,
                query_start: (0..=seqs).map(|s| s * rows).collect(),
                context_lens: vec![ctx; seqs],
                block_tables: (0..seqs).map(blocks).collect(),
                slot_mapping: (0..seqs)
                    .flat_map(|s| (ctx - rows..ctx).map(move |p| (s * ctx + p) as u32))
                    .collect(),
                device: None,
            };
            g.bench_with_input(BenchmarkId::from_parameter(name), &q, |b, q| {
                b.iter(|| black_box(paged_attention(q, &k, &v, &meta, &params, None).unwrap()))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, matmul, mxfp4, attention);
peagle_benches::main_on_pool!(benches);

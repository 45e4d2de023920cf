//! Times gpt-oss-20b-shaped MXFP4 experts (`Mxfp4Experts`, kernels/moe_mxfp4*.cu: 32 experts of
//! 2880 x 2880, top 4, the clamped SwiGLU) on the GPU, bf16 rows, at 1 to 2048 rows: the
//! tensor cores' projections in narrow tiles (8 pairs of an expert) and in wide ones (32) side
//! by side, and the CUDA cores'. Then Qwen3-30B-A3B-shaped dense experts (`DenseExperts`,
//! kernels/moe_dense.cu: 128 experts of 2048 x 768, top 8, SwiGLU), bf16 and FP8 (blocks of
//! 128 x 128), in narrow and wide tiles, their lines marked `"dense": true` with their
//! `"weights"`. One JSON line per block and row count, with the expert
//! weight bytes the batch reads (its distinct experts') over each time. Run by
//! scripts/gpu_check.sh.
//!
//!     cargo run --release --example moe_experts --features cuda

#[path = "common/timing.rs"]
mod timing;

use candle_core::{DType, Device, Tensor};
use float8::F8E4M3;
use peagle_kernels::{
    CudaMatmul, DenseExpert, DenseExperts, ExpertMatrix, Fp8Weight, MmaTiles, Mxfp4Expert, Mxfp4Experts, Mxfp4Weight,
    Routing, MXFP4_BLOCK,
};
use timing::time;

const EXPERTS: usize = 32;
const HIDDEN: usize = 2880;
const INTER: usize = 2880;

/// Deterministic bytes, `n` of them.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect()
}

/// A random MXFP4 weight [out, inner], its scales 2^-7 .. 2^-4 as a trained one's are small.
fn mxfp4(out: usize, inner: usize, seed: u64) -> candle_core::Result<Mxfp4Weight> {
    let groups = inner / MXFP4_BLOCK;
    let scales: Vec<u8> = bytes(out * groups, seed + 1).iter().map(|b| 120 + b % 4).collect();
    Mxfp4Weight::new(
        &Tensor::from_vec(bytes(out * groups * 16, seed), (out, groups, 16), &Device::Cpu)?,
        &Tensor::from_vec(scales, (out, groups), &Device::Cpu)?,
    )
}

/// How many experts the rows' top `k` logits touch.
fn experts_touched(logits: &Tensor, k: usize) -> candle_core::Result<usize> {
    let mut touched = vec![false; logits.dim(1)?];
    for row in logits.to_dtype(DType::F32)?.to_vec2::<f32>()? {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|a, b| row[*b].total_cmp(&row[*a]));
        order[..k].iter().for_each(|e| touched[*e] = true);
    }
    Ok(touched.iter().filter(|t| **t).count())
}

fn main() -> candle_core::Result<()> {
    let device = peagle_kernels::open_cuda(0)?;
    let weights = (0..EXPERTS as u64)
        .map(|e| Ok((mxfp4(2 * INTER, HIDDEN, 10 * e)?, mxfp4(HIDDEN, INTER, 10 * e + 5)?)))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let (gate_up_bias, down_bias) = (vec![0.01f32; 2 * INTER], vec![0.01f32; HIDDEN]);
    let experts: Vec<Mxfp4Expert> = weights
        .iter()
        .map(|(gate_up, down)| Mxfp4Expert {
            gate_up,
            gate_up_bias: &gate_up_bias,
            down,
            down_bias: &down_bias,
        })
        .collect();
    let experts = Mxfp4Experts::new(&device, &experts)?;
    let routing = Routing {
        top_k: 4,
        normalize: true,
        clamp: Some((1.702, 7.0)),
    };
    // Per expert: gate_up's and down's codes, half a byte a weight, and a scale byte a block.
    let expert_bytes = (3 * HIDDEN * INTER) as f64 * (0.5 + 1.0 / MXFP4_BLOCK as f64);
    for rows in [1, 8, 64, 256, 512, 2048] {
        let x = Tensor::randn(0f32, 1.0, (rows, HIDDEN), &device)?.to_dtype(DType::BF16)?;
        let logits = Tensor::randn(0f32, 1.0, (rows, EXPERTS), &device)?.to_dtype(DType::BF16)?;
        let reps = if rows >= 256 { 5 } else { 30 };
        let by = |kernel, tiles| {
            time(&device, reps, || {
                experts.forward_tiled(&x, &logits, &routing, kernel, tiles)
            })
        };
        let narrow = by(CudaMatmul::Mma, MmaTiles::Narrow)?;
        let wide = by(CudaMatmul::Mma, MmaTiles::Wide)?;
        let fma = by(CudaMatmul::Fma, MmaTiles::ByBatch)?;
        let touched = experts_touched(&logits, routing.top_k)?;
        let read = touched as f64 * expert_bytes;
        println!(
            "{{\"rows\": {rows}, \"pairs\": {}, \"experts_touched\": {touched}, \"narrow_ms\": {:.4}, \"wide_ms\": {:.4}, \"fma_ms\": {:.4}, \"wide_over_narrow\": {:.3}, \"narrow_weight_gb_per_s\": {:.1}, \"wide_weight_gb_per_s\": {:.1}}}",
            rows * routing.top_k,
            narrow * 1e3,
            wide * 1e3,
            fma * 1e3,
            wide / narrow,
            read / narrow / 1e9,
            read / wide / 1e9
        );
    }
    dense(&device)
}

/// Qwen3-30B-A3B's experts: 128 of 2048 x 768, top 8 renormalized, SwiGLU, no biases; in bf16,
/// then in e4m3 blocks of 128 x 128 as its FP8 checkpoint has them.
fn dense(device: &Device) -> candle_core::Result<()> {
    for fp8 in [false, true] {
        time_dense(device, fp8)?;
    }
    Ok(())
}

const DENSE_EXPERTS: usize = 128;
const DENSE_HIDDEN: usize = 2048;
const DENSE_INTER: usize = 768;
const FP8_BLOCK: usize = 128;

/// A random [rows, cols] weight for the dense experts: bf16, or e4m3 codes (none of them NaN)
/// with a scale a block.
enum Weight {
    Bf16(Tensor),
    Fp8(Fp8Weight),
}

impl Weight {
    fn random(device: &Device, (rows, cols): (usize, usize), seed: u64, fp8: bool) -> candle_core::Result<Self> {
        if !fp8 {
            return Ok(Self::Bf16(
                Tensor::randn(0f32, 0.02, (rows, cols), device)?.to_dtype(DType::BF16)?,
            ));
        }
        let codes: Vec<F8E4M3> = bytes(rows * cols, seed)
            .into_iter()
            .map(|b| F8E4M3::from_bits(b & 0xBF))
            .collect();
        let scales = Tensor::full(0.01f32, (rows.div_ceil(FP8_BLOCK), cols.div_ceil(FP8_BLOCK)), device)?;
        let codes = Tensor::from_vec(codes, (rows, cols), &Device::Cpu)?.to_device(device)?;
        Ok(Self::Fp8(Fp8Weight::new(codes, scales, (FP8_BLOCK, FP8_BLOCK))?))
    }

    fn matrix(&self) -> ExpertMatrix<'_> {
        match self {
            Self::Bf16(w) => ExpertMatrix::Bf16(w),
            Self::Fp8(w) => ExpertMatrix::Fp8(w),
        }
    }
}

/// One JSON line a row count for the dense experts, in bf16 or FP8: every expert holds the
/// same values at its own addresses, which the kernels read alike.
fn time_dense(device: &Device, fp8: bool) -> candle_core::Result<()> {
    let gate_up = Weight::random(device, (2 * DENSE_INTER, DENSE_HIDDEN), 1, fp8)?;
    let down = Weight::random(device, (DENSE_HIDDEN, DENSE_INTER), 2, fp8)?;
    let parts: Vec<DenseExpert> = (0..DENSE_EXPERTS)
        .map(|_| DenseExpert {
            gate_up: gate_up.matrix(),
            gate_up_bias: None,
            down: down.matrix(),
            down_bias: None,
        })
        .collect();
    let experts = DenseExperts::new(device, &parts)?;
    let routing = Routing {
        top_k: 8,
        normalize: true,
        clamp: None,
    };
    // Per expert: a byte or two a weight, and an FP8 block's f32 scale.
    let values = (3 * DENSE_HIDDEN * DENSE_INTER) as f64;
    let expert_bytes = match fp8 {
        true => values * (1.0 + 4.0 / (FP8_BLOCK * FP8_BLOCK) as f64),
        false => values * 2.0,
    };
    let weights = if fp8 { "fp8" } else { "bf16" };
    for rows in [1, 8, 64, 256, 512, 2048] {
        let x = Tensor::randn(0f32, 1.0, (rows, DENSE_HIDDEN), device)?.to_dtype(DType::BF16)?;
        let logits = Tensor::randn(0f32, 1.0, (rows, DENSE_EXPERTS), device)?.to_dtype(DType::BF16)?;
        let reps = if rows >= 256 { 5 } else { 30 };
        let by = |tiles| time(device, reps, || experts.forward_tiled(&x, &logits, &routing, tiles));
        let (narrow, wide) = (by(MmaTiles::Narrow)?, by(MmaTiles::Wide)?);
        let touched = experts_touched(&logits, routing.top_k)?;
        let read = touched as f64 * expert_bytes;
        println!(
            "{{\"dense\": true, \"weights\": \"{weights}\", \"rows\": {rows}, \"pairs\": {}, \"experts_touched\": {touched}, \"narrow_ms\": {:.4}, \"wide_ms\": {:.4}, \"wide_over_narrow\": {:.3}, \"narrow_weight_gb_per_s\": {:.1}, \"wide_weight_gb_per_s\": {:.1}}}",
            rows * routing.top_k,
            narrow * 1e3,
            wide * 1e3,
            wide / narrow,
            read / narrow / 1e9,
            read / wide / 1e9
        );
    }
    Ok(())
}

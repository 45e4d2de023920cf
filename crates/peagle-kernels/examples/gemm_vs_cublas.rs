//! Times the batch-invariant matmul's two kernels (`invariant_matmul_by`: the CUDA cores'
//! kernels/linear.cu and the tensor cores' kernels/linear_mma.cu) against cuBLAS (candle's
//! matmul) on the GPU, bf16, for a Llama-8B-shaped projection (4096 -> 14336) at M = 1 to 2048
//! rows, and the tensor cores' narrow, wide and staged forms side by side at each (the form M
//! picks is the `mma` column); then the same weight as a dense MLP's fused gate/up projection, gated in
//! the matmul's launch (`invariant_linear_swiglu`) and by a `swiglu` launch after it; and the
//! weight in block-scaled FP8 (blocks of 128 x 128, as FP8 checkpoints have them), by the CUDA
//! cores and the tensor cores (`fp8_linear_tiled`); prints a JSON line per M. Run by
//! scripts/gpu_check.sh.
//!
//!     cargo run --release --example gemm_vs_cublas --features cuda

#[path = "common/timing.rs"]
mod timing;

use candle_core::{DType, Tensor};
use peagle_kernels::{
    fp8_linear_tiled, invariant_linear_swiglu, invariant_matmul_by, invariant_matmul_tiled, swiglu, CudaMatmul,
    Fp8Weight, MmaTiles,
};
use timing::time;

fn main() -> candle_core::Result<()> {
    let device = peagle_kernels::open_cuda(0)?;
    let (n, k) = (14336, 4096);
    let w = Tensor::randn(0f32, 0.02, (n, k), &device)?.to_dtype(DType::BF16)?;
    let w_t = w.t()?;
    // In e4m3 under one scale a block, as a checkpoint's quantizer would leave it: the random
    // weight's values are well inside e4m3's range at a scale of 2^-8.
    let block = 128;
    let scales = Tensor::full(2f32.powi(-8), (n.div_ceil(block), k.div_ceil(block)), &device)?;
    let codes = (w.to_dtype(DType::F32)? * 256.0)?.to_dtype(DType::F8E4M3)?;
    let fp8 = Fp8Weight::new(codes, scales, (block, block))?;
    for m in [1, 8, 16, 32, 64, 256, 2048] {
        let x = Tensor::randn(0f32, 1.0, (m, k), &device)?.to_dtype(DType::BF16)?;
        let reps = if m >= 256 { 5 } else { 50 };
        let fma = time(&device, reps, || invariant_matmul_by(&x, &w, CudaMatmul::Fma))?;
        let mma = time(&device, reps, || invariant_matmul_by(&x, &w, CudaMatmul::Mma))?;
        let tiled = |tiles| time(&device, reps, || invariant_matmul_tiled(&x, &w, CudaMatmul::Mma, tiles));
        let (narrow, wide, staged) = (
            tiled(MmaTiles::Narrow)?,
            tiled(MmaTiles::Wide)?,
            tiled(MmaTiles::Staged)?,
        );
        let cublas = time(&device, reps, || x.matmul(&w_t))?;
        let fused = time(&device, reps, || {
            invariant_linear_swiglu(&x, &w, None, MmaTiles::ByBatch)
        })?;
        let apart = time(&device, reps, || swiglu(&invariant_matmul_by(&x, &w, CudaMatmul::Mma)?))?;
        let fp8_by = |kernel| time(&device, reps, || fp8_linear_tiled(&x, &fp8, kernel, MmaTiles::ByBatch));
        let (fp8_fma, fp8_mma) = (fp8_by(CudaMatmul::Fma)?, fp8_by(CudaMatmul::Mma)?);
        let weight_bytes = (n * k * 2) as f64;
        println!(
            "{{\"m\": {m}, \"n\": {n}, \"k\": {k}, \"fma_ms\": {:.4}, \"mma_ms\": {:.4}, \"mma_narrow_ms\": {:.4}, \"mma_wide_ms\": {:.4}, \"mma_staged_ms\": {:.4}, \"cublas_ms\": {:.4}, \"fma_ratio\": {:.3}, \"mma_ratio\": {:.3}, \"fma_weight_gb_per_s\": {:.1}, \"mma_weight_gb_per_s\": {:.1}, \"swiglu_fused_ms\": {:.4}, \"swiglu_apart_ms\": {:.4}, \"fp8_fma_ms\": {:.4}, \"fp8_mma_ms\": {:.4}}}",
            fma * 1e3,
            mma * 1e3,
            narrow * 1e3,
            wide * 1e3,
            staged * 1e3,
            cublas * 1e3,
            fma / cublas,
            mma / cublas,
            weight_bytes / fma / 1e9,
            weight_bytes / mma / 1e9,
            fused * 1e3,
            apart * 1e3,
            fp8_fma * 1e3,
            fp8_mma * 1e3
        );
    }
    Ok(())
}

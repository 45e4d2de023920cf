//! Which batch-invariant matmul a GPU runs, one answer per process: both kernels compute every
//! element by a chain that depends on K alone, but not the same chain, so a process must keep
//! to one for a row's bits not to depend on its batch.
//!
//! `mma` (the default, `kernels/linear_mma.cu`) runs bf16 products on the tensor cores, for
//! bf16 activations with K a multiple of 32 times bf16 weights or block-scaled FP8 ones whose
//! blocks are a multiple of 32 wide (other products keep to `fma`), and so do gpt-oss's expert
//! projections for bf16 rows (`kernels/moe_mxfp4_mma.cu`); it has no
//! bit-exact CPU reference, only a tolerance. `fma` (`kernels/linear.cu`, chosen with
//! `PEAGLE_CUDA_MATMUL=fma`) sums in f32 fused multiply-adds on the CUDA cores, bit for bit as
//! its CPU reference, and is slower wherever a step has more than one row.

use std::sync::OnceLock;

/// A batch-invariant matmul kernel family of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaMatmul {
    /// f32 fused multiply-adds on the CUDA cores (`kernels/linear.cu`).
    Fma,
    /// bf16 tensor-core products with f32 accumulation (`kernels/linear_mma.cu`).
    Mma,
}

/// How the tensor-core kernels cover a batch: `kernels/linear_mma.cu` 8 rows of x a block, 32
/// or 64 (staged), `kernels/moe_mxfp4_mma.cu` tiles of 8 pairs of an expert or 32. Every form computes
/// each element by the same chain, so the choice is one of speed alone; inference takes
/// `ByBatch`, the others are for comparing the forms. The CUDA cores' kernels choose their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaTiles {
    /// Narrow for a few rows, wide for more, staged for many: the matmul wide above 8 rows and
    /// staged from 64 where that makes 256 blocks or more (from 128 rows of a Llama-8B MLP),
    /// the experts wide where the average expert has more than 8 pairs.
    ByBatch,
    /// The most blocks, and so the most weight loads in flight: decode steps.
    Narrow,
    /// Each weight tile read (or dequantized) once for four times the rows.
    Wide,
    /// The matmul's 8 warps sharing each step's operands through shared memory, 64 rows and 64
    /// columns a block: each weight tile read once for 64 rows. The experts take it as `Wide`.
    Staged,
}

/// The environment variable that chooses the process's kernel.
pub const CUDA_MATMUL_ENV: &str = "PEAGLE_CUDA_MATMUL";

impl CudaMatmul {
    /// The process's kernel: `PEAGLE_CUDA_MATMUL` (`mma`, the default, or `fma`), read once;
    /// the error says what the variable holds instead.
    pub fn chosen() -> std::result::Result<CudaMatmul, String> {
        static CHOSEN: OnceLock<std::result::Result<CudaMatmul, String>> = OnceLock::new();
        CHOSEN
            .get_or_init(|| Self::parse(std::env::var(CUDA_MATMUL_ENV).ok().as_deref()))
            .clone()
    }

    /// `chosen`, as an op's error.
    #[cfg(feature = "cuda")]
    pub(crate) fn for_op(op: &'static str) -> candle_core::Result<CudaMatmul> {
        Self::chosen().map_err(|e| crate::error::bad_input(op, e))
    }

    /// The kernel a value of `PEAGLE_CUDA_MATMUL` names (None: unset).
    fn parse(value: Option<&str>) -> std::result::Result<CudaMatmul, String> {
        match value {
            None | Some("mma") => Ok(Self::Mma),
            Some("fma") => Ok(Self::Fma),
            Some(other) => Err(format!("{CUDA_MATMUL_ENV} must be mma or fma, not {other:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_names_a_kernel_or_is_refused() {
        assert_eq!(CudaMatmul::parse(None), Ok(CudaMatmul::Mma));
        assert_eq!(CudaMatmul::parse(Some("fma")), Ok(CudaMatmul::Fma));
        assert_eq!(CudaMatmul::parse(Some("mma")), Ok(CudaMatmul::Mma));
        let err = CudaMatmul::parse(Some("cublas")).unwrap_err();
        assert_eq!(err, "PEAGLE_CUDA_MATMUL must be mma or fma, not \"cublas\"");
    }
}

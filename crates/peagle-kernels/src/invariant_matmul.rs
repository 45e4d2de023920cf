//! The batch-invariant matrix product of GPU inference: `x` [M, K] times `w` [N, K]
//! transposed, [M, N].
//!
//! Every output element is one fixed chain of operations that depends on K alone: 32 partial
//! sums, partial `l` taking elements `8l + 256i + j` (j = 0..7, i rising) by fused multiply-add,
//! then a butterfly over the partials (`p[l] + p[l ^ 16]`, then 8, 4, 2, 1). No split of K
//! depends on M, so a row gives the same bits alone, in a verification window or among 2,048
//! prefill rows. The CUDA kernel (`kernels/linear.cu`) is one warp per element, the partials
//! its lanes; the CPU forward here follows the same chain and is its bit-exact reference. (CPU
//! inference has its own invariant kernel, `linear`, with a faster order for CPUs.)

use crate::contiguous::contiguous;
use crate::cuda_matmul::{CudaMatmul, MmaTiles};
use crate::error::matmul_dims;
use crate::swiglu::gate_rows;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

/// `x` [M, K] times `w` [N, K] transposed. On CUDA: f32 or bf16 activations, a weight of the
/// same dtype or bf16, K a multiple of 8, by the process's kernel (`CudaMatmul::chosen`). On
/// the CPU (the reference of the `fma` kernel): f32.
pub fn invariant_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    invariant_linear(x, w, None, None)
}

/// `invariant_matmul` by the kernel `kernel` on CUDA, whatever the process chose: for
/// comparing the kernels. A process that mixes them has rows whose bits depend on the kernel.
pub fn invariant_matmul_by(x: &Tensor, w: &Tensor, kernel: CudaMatmul) -> Result<Tensor> {
    invariant_linear(x, w, None, Some(kernel))
}

/// `invariant_matmul_by` in the tensor cores' tiles `tiles` asks for (by the batch: wide above
/// 8 rows): for comparing them. Each gives every element the same bits.
pub fn invariant_matmul_tiled(x: &Tensor, w: &Tensor, kernel: CudaMatmul, tiles: MmaTiles) -> Result<Tensor> {
    x.apply_op2_no_bwd(
        w,
        &InvariantMatmul {
            kernel: Some(kernel),
            tiles,
            output: MatmulOutput::Sums,
        },
    )
}

/// `invariant_matmul` plus `bias` [N] where given, by `kernel` on CUDA (None: the process's).
/// The kernel adds the bias to each element's f32 sum before the element's one rounding, in
/// the launch that computes the sum; the CPU reference adds it to the f32 sum.
pub fn invariant_linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, kernel: Option<CudaMatmul>) -> Result<Tensor> {
    let op = InvariantMatmul {
        kernel,
        tiles: MmaTiles::ByBatch,
        output: MatmulOutput::Sums,
    };
    op.apply(x, w, bias)
}

/// SwiGLU's gating of a fused gate/up projection, `w` [2I, K] with the gate's rows first:
/// `swiglu(invariant_linear(x, w, bias, None))`, [M, I], with its bits. On the tensor cores
/// one launch sums and gates (`kernels/linear_mma.cu`'s SwiGLU forms, in `tiles`), with no
/// [M, 2I] tensor between; elsewhere it is the two ops.
pub fn invariant_linear_swiglu(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, tiles: MmaTiles) -> Result<Tensor> {
    let op = InvariantMatmul {
        kernel: None,
        tiles,
        output: MatmulOutput::Swiglu,
    };
    op.apply(x, w, bias)
}

/// What a matmul gives: its sums, or SwiGLU's gating of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MatmulOutput {
    Sums,
    /// Of a fused gate/up projection, the gate's columns first: half the columns.
    Swiglu,
}

struct InvariantMatmul {
    /// The CUDA kernel; None: the process's.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    kernel: Option<CudaMatmul>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    tiles: MmaTiles,
    output: MatmulOutput,
}

const LANES: usize = 32;
const CHUNK: usize = 8;

impl CustomOp2 for InvariantMatmul {
    fn name(&self) -> &'static str {
        "peagle-invariant-matmul"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (out, m, n) = reference(xs, xl, ws, wl)?;
        self.finish(out, m, n)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::linear(
            (xs, xl),
            (ws, wl),
            None,
            None,
            self.cuda_kernel()?,
            self.tiles,
            self.output,
        )
    }
}

impl CustomOp3 for InvariantMatmul {
    fn name(&self) -> &'static str {
        "peagle-invariant-linear"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (mut out, m, n) = reference(xs, xl, ws, wl)?;
        let bias = contiguous(bs.as_slice::<f32>()?, bl, "bias")?;
        if bias.len() != n {
            return Err(crate::error::bad_input(
                "invariant_matmul",
                format!("a bias of {} for {n} outputs", bias.len()),
            ));
        }
        for row in out.chunks_exact_mut(n.max(1)) {
            row.iter_mut().zip(bias.iter()).for_each(|(o, b)| *o += b);
        }
        self.finish(out, m, n)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
        bs: &candle_core::CudaStorage,
        bl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::linear(
            (xs, xl),
            (ws, wl),
            None,
            Some((bs, bl)),
            self.cuda_kernel()?,
            self.tiles,
            self.output,
        )
    }
}

impl InvariantMatmul {
    /// The op over `x`, `w` and `bias`, on whichever device they are. A SwiGLU output needs
    /// an even number of features, checked here for both devices.
    fn apply(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let n = w.dim(0)?;
        if self.output == MatmulOutput::Swiglu && !n.is_multiple_of(2) {
            return Err(crate::error::bad_input(
                "invariant_matmul",
                format!("{n} output features do not split into gate and up"),
            ));
        }
        match bias {
            None => x.apply_op2_no_bwd(w, self),
            Some(bias) => x.apply_op3_no_bwd(w, bias, self),
        }
    }

    /// The CPU's result from the sums `out` [m, n] (n even for SwiGLU: `apply`).
    fn finish(&self, out: Vec<f32>, m: usize, n: usize) -> Result<(CpuStorage, Shape)> {
        match self.output {
            MatmulOutput::Sums => Ok((CpuStorage::F32(out), Shape::from((m, n)))),
            MatmulOutput::Swiglu => Ok((CpuStorage::F32(gate_rows(&out, n / 2)), Shape::from((m, n / 2)))),
        }
    }

    /// The kernel asked for, or the process's.
    #[cfg(feature = "cuda")]
    fn cuda_kernel(&self) -> Result<CudaMatmul> {
        self.kernel.map_or_else(|| CudaMatmul::for_op("invariant_matmul"), Ok)
    }
}

/// The product [M, N] of f32 `x` [M, K] and `w` [N, K] transposed, each element in the
/// kernel's order, with M and N.
fn reference(xs: &CpuStorage, xl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(Vec<f32>, usize, usize)> {
    let (m, k, n) = matmul_dims("invariant_matmul", xl.shape(), wl.shape())?;
    let x = contiguous(xs.as_slice::<f32>()?, xl, "x")?;
    let w = contiguous(ws.as_slice::<f32>()?, wl, "weight")?;
    let mut out = Vec::with_capacity(m * n);
    for x_row in x.chunks_exact(k.max(1)).take(m) {
        out.extend(w.chunks_exact(k.max(1)).take(n).map(|w_row| dot(x_row, w_row)));
    }
    Ok((out, m, n))
}

/// One element in the kernel's order.
fn dot(x: &[f32], w: &[f32]) -> f32 {
    let mut partial = [0f32; LANES];
    for (lane, p) in partial.iter_mut().enumerate() {
        let mut k0 = lane * CHUNK;
        while k0 < x.len() {
            for j in k0..(k0 + CHUNK).min(x.len()) {
                *p = x[j].mul_add(w[j], *p);
            }
            k0 += LANES * CHUNK;
        }
    }
    let mut offset = LANES / 2;
    while offset > 0 {
        partial = std::array::from_fn(|l| partial[l] + partial[l ^ offset]);
        offset /= 2;
    }
    partial[0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{max_abs_diff, values};
    use candle_core::Device;

    #[test]
    fn close_to_candles_matmul_and_the_same_bits_for_a_row_alone() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (5, 520), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (7, 520), &dev).unwrap();
        let ours = invariant_matmul(&x, &w).unwrap();
        let theirs = x.matmul(&w.t().unwrap()).unwrap();
        let diff = max_abs_diff(&ours, &theirs);
        assert!(diff < 1e-3, "{diff}");
        let alone = values(&invariant_matmul(&x.narrow(0, 3, 1).unwrap(), &w).unwrap());
        let in_batch: Vec<f32> = ours.get(3).unwrap().to_vec1().unwrap();
        assert_eq!(alone, in_batch);
        let err = invariant_matmul(&x, &x.t().unwrap().contiguous().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("520 columns"), "{err}");
    }

    /// The reference adds a bias to each f32 sum, and refuses one of another width.
    #[test]
    fn a_bias_is_added_to_each_sum() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (3, 64), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (5, 64), &dev).unwrap();
        let bias = Tensor::randn(0f32, 1.0, 5, &dev).unwrap();
        let biased = invariant_linear(&x, &w, Some(&bias), None).unwrap();
        let want = invariant_matmul(&x, &w).unwrap().broadcast_add(&bias).unwrap();
        assert_eq!(values(&biased), values(&want));
        let err = invariant_linear(&x, &w, Some(&bias.narrow(0, 0, 4).unwrap()), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a bias of 4 for 5 outputs"), "{err}");
    }

    /// The reference gates a fused projection's sums, bias included, as `swiglu` does, and
    /// refuses an odd number of features.
    #[test]
    fn the_swiglu_form_gates_the_sums() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (3, 64), &dev).unwrap();
        let w = Tensor::randn(0f32, 1.0, (10, 64), &dev).unwrap();
        let bias = Tensor::randn(0f32, 1.0, 10, &dev).unwrap();
        for bias in [None, Some(&bias)] {
            let gated = invariant_linear_swiglu(&x, &w, bias, MmaTiles::ByBatch).unwrap();
            let want = crate::swiglu(&invariant_linear(&x, &w, bias, None).unwrap()).unwrap();
            assert_eq!(gated.dims(), [3, 5]);
            assert_eq!(values(&gated), values(&want));
        }
        let err = invariant_linear_swiglu(&x, &w.narrow(0, 0, 9).unwrap(), None, MmaTiles::ByBatch)
            .unwrap_err()
            .to_string();
        assert!(err.contains("9 output features do not split"), "{err}");
    }
}

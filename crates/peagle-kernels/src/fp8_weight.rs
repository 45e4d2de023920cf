//! Matrix product with block-scaled FP8 weights, as FP8 checkpoints store them (DeepSeek-V3's
//! and Qwen3-FP8's `quant_method: "fp8"`): `weight` [out, in] in e4m3 and `weight_scale_inv`
//! [ceil(out / bn), ceil(in / bk)] in f32, one scale per bn x bk block, the value being
//! `weight * scale` (despite the name). The weight stays one byte a value and activations keep
//! their dtype (no activation quantization). On the CPU and the CUDA cores each value is
//! widened and scaled in f32 as it is read; bf16 rows on the tensor cores (the process's
//! `PEAGLE_CUDA_MATMUL=mma`, blocks a multiple of 32 wide) multiply the widened values and
//! scale each step's sums. Every output element keeps an order that depends on `in` alone.

use crate::contiguous::contiguous;
use crate::cuda_matmul::{CudaMatmul, MmaTiles};
use crate::dequantized_linear::dequantized_linear;
use crate::error::{bad_input, matmul_dims};
use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};
use float8::F8E4M3;

/// A block-scaled FP8 weight [out, in] on its device.
#[derive(Debug, Clone)]
pub struct Fp8Weight {
    weight: Tensor,
    scales: Tensor,
    block: (usize, usize),
}

impl Fp8Weight {
    /// `weight` [out, in] (f8e4m3), `scales` [ceil(out / bn), ceil(in / bk)] (f32), `block`
    /// (bn, bk); bk a multiple of 8, as the CUDA kernel reads 8 values under one scale.
    pub fn new(weight: Tensor, scales: Tensor, block: (usize, usize)) -> Result<Self> {
        let (out_dim, in_dim) = weight.dims2()?;
        let (bn, bk) = block;
        let want = [out_dim.div_ceil(bn.max(1)), in_dim.div_ceil(bk.max(1))];
        if weight.dtype() != DType::F8E4M3
            || scales.dtype() != DType::F32
            || bn == 0
            || bk == 0
            || !bk.is_multiple_of(8)
            || scales.dims() != want
        {
            return Err(bad_input(
                "fp8 weight",
                format!(
                    "a {:?} weight {:?} with {:?} scales {:?} in blocks of {bn}x{bk}: want f8e4m3, and f32 scales {want:?} in blocks whose width is a multiple of 8",
                    weight.dtype(),
                    weight.dims(),
                    scales.dtype(),
                    scales.dims()
                ),
            ));
        }
        Ok(Self { weight, scales, block })
    }

    pub fn dims(&self) -> (usize, usize) {
        self.weight.dims2().expect("checked in new")
    }

    /// (bn, bk): the rows and columns a scale covers.
    pub fn block(&self) -> (usize, usize) {
        self.block
    }

    /// The e4m3 values and their blocks' scales.
    #[cfg(feature = "cuda")]
    pub(crate) fn parts(&self) -> (&Tensor, &Tensor) {
        (&self.weight, &self.scales)
    }

    /// Stacks weights of the same input width and block by rows, as fused projections do;
    /// every part but the last must end on a block boundary, so scales stack with them.
    pub fn concat(parts: &[Fp8Weight]) -> Result<Self> {
        let Some(first) = parts.first() else {
            return Err(bad_input("fp8 weight", "nothing to stack"));
        };
        let misfit = parts.iter().enumerate().find(|(i, p)| {
            p.block != first.block
                || p.dims().1 != first.dims().1
                || (*i + 1 < parts.len() && !p.dims().0.is_multiple_of(first.block.0))
        });
        if let Some((i, p)) = misfit {
            return Err(bad_input(
                "fp8 weight",
                format!(
                    "part {i} ({:?} in blocks of {:?}) does not stack on {:?} in blocks of {:?}",
                    p.dims(),
                    p.block,
                    first.dims(),
                    first.block
                ),
            ));
        }
        let cat = |f: fn(&Fp8Weight) -> &Tensor| Tensor::cat(&parts.iter().map(f).collect::<Vec<_>>(), 0);
        Self::new(cat(|p| &p.weight)?, cat(|p| &p.scales)?, first.block)
    }

    /// The weight [out, in] in f32, on its device: each value times its block's scale.
    /// Computed on the host, then copied: candle's CUDA cast from FP8 looks up a kernel by a
    /// name its kernels do not have (`cast_f8e4m3_f32` for `cast_f8_e4m3_f32`).
    pub fn dequantize(&self) -> Result<Tensor> {
        let (out_dim, in_dim) = self.dims();
        let (bn, bk) = self.block;
        let cpu = Device::Cpu;
        let blocks_of =
            |n: usize, b: usize| Tensor::from_vec((0..n).map(|i| (i / b) as u32).collect::<Vec<_>>(), n, &cpu);
        let scales = self
            .scales
            .to_device(&cpu)?
            .index_select(&blocks_of(out_dim, bn)?, 0)?
            .index_select(&blocks_of(in_dim, bk)?, 1)?;
        (self.weight.to_device(&cpu)?.to_dtype(DType::F32)? * scales)?.to_device(self.weight.device())
    }
}

/// `x` [rows, in] times the FP8 weight [out, in] transposed: [rows, out], in x's dtype. On the
/// CPU x is f32; on CUDA f32 or bf16, by the process's kernel (`CudaMatmul::chosen`).
pub fn fp8_linear(x: &Tensor, w: &Fp8Weight) -> Result<Tensor> {
    x.apply_op3_no_bwd(
        &w.weight,
        &w.scales,
        &Fp8Linear {
            block: w.block,
            kernel: None,
            tiles: MmaTiles::ByBatch,
        },
    )
}

/// `fp8_linear` by `kernel` on CUDA, in the tensor cores' `tiles`, whatever the process chose:
/// for comparing the kernels and the forms.
pub fn fp8_linear_tiled(x: &Tensor, w: &Fp8Weight, kernel: CudaMatmul, tiles: MmaTiles) -> Result<Tensor> {
    x.apply_op3_no_bwd(
        &w.weight,
        &w.scales,
        &Fp8Linear {
            block: w.block,
            kernel: Some(kernel),
            tiles,
        },
    )
}

struct Fp8Linear {
    block: (usize, usize),
    /// The CUDA kernel; None: the process's.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    kernel: Option<CudaMatmul>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    tiles: MmaTiles,
}

impl CustomOp3 for Fp8Linear {
    fn name(&self) -> &'static str {
        "peagle-fp8-linear"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
        ss: &CpuStorage,
        sl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, in_dim, out_dim) = matmul_dims("fp8_linear", xl.shape(), wl.shape())?;
        let x = contiguous(xs.as_slice::<f32>()?, xl, "x")?;
        let w = contiguous(ws.as_slice::<F8E4M3>()?, wl, "weight")?;
        let scales = contiguous(ss.as_slice::<f32>()?, sl, "scales")?;
        let (bn, bk) = self.block;
        let scale_cols = in_dim.div_ceil(bk);
        let out = dequantized_linear(
            x,
            rows,
            (out_dim, in_dim),
            |r, buf| {
                let row_scales = &scales[r / bn * scale_cols..][..scale_cols];
                for ((v, o), k) in w[r * in_dim..][..in_dim].iter().zip(buf.iter_mut()).zip(0..) {
                    *o = f32::from(*v) * row_scales[k / bk];
                }
            },
            |_, _, _| None,
        );
        Ok((CpuStorage::F32(out), Shape::from((rows, out_dim))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
        ss: &candle_core::CudaStorage,
        sl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let kernel = self.kernel.map_or_else(|| CudaMatmul::for_op("fp8_linear"), Ok)?;
        crate::cuda::linear(
            (xs, xl),
            (ws, wl),
            Some(((ss, sl), self.block)),
            None,
            kernel,
            self.tiles,
            crate::invariant_matmul::MatmulOutput::Sums,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::max_abs_diff;
    use candle_core::Device;

    /// A weight [out, in] quantized in blocks as FP8 checkpoints are: each block scaled so
    /// its largest value is 448.
    fn quantized(out: usize, inner: usize, block: (usize, usize)) -> (Fp8Weight, Tensor) {
        let dense = Tensor::randn(0f32, 0.05, (out, inner), &Device::Cpu).unwrap();
        let (bn, bk) = block;
        let (rows, cols) = (out.div_ceil(bn), inner.div_ceil(bk));
        let d: Vec<Vec<f32>> = dense.to_vec2().unwrap();
        let mut scales = vec![0f32; rows * cols];
        for (i, s) in scales.iter_mut().enumerate() {
            let (br, bc) = (i / cols, i % cols);
            let max = (br * bn..((br + 1) * bn).min(out))
                .flat_map(|r| d[r][bc * bk..((bc + 1) * bk).min(inner)].iter().map(|v| v.abs()))
                .fold(0f32, f32::max);
            *s = max / 448.0;
        }
        let bytes: Vec<F8E4M3> = (0..out * inner)
            .map(|i| F8E4M3::from_f32(d[i / inner][i % inner] / scales[i / inner / bn * cols + i % inner / bk]))
            .collect();
        let w = Fp8Weight::new(
            Tensor::from_vec(bytes, (out, inner), &Device::Cpu).unwrap(),
            Tensor::from_vec(scales, (rows, cols), &Device::Cpu).unwrap(),
            block,
        )
        .unwrap();
        (w, dense)
    }

    #[test]
    fn equals_a_matmul_by_the_dequantized_weight_and_is_batch_invariant() {
        // Blocks that do not divide the shape, as at the edges of real layers.
        let (w, dense) = quantized(40, 200, (16, 64));
        let x = Tensor::randn(0f32, 1.0, (6, 200), &Device::Cpu).unwrap();
        let ours = fp8_linear(&x, &w).unwrap();
        let want = x.matmul(&w.dequantize().unwrap().t().unwrap()).unwrap();
        let diff = max_abs_diff(&ours, &want);
        assert!(diff < 1e-4, "against the dequantized weight: {diff}");
        // And e4m3's rounding of the original, about 2^-4 of each value.
        let diff = max_abs_diff(&ours, &x.matmul(&dense.t().unwrap()).unwrap());
        assert!(diff < 0.1, "against the original weight: {diff}");
        let alone = fp8_linear(&x.narrow(0, 4, 1).unwrap(), &w).unwrap();
        assert_eq!(
            alone.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            ours.get(4).unwrap().to_vec1::<f32>().unwrap()
        );
    }

    #[test]
    fn stacking_keeps_each_parts_rows_and_needs_block_boundaries() {
        let ((a, _), (b, _)) = (quantized(32, 64, (16, 32)), quantized(24, 64, (16, 32)));
        let both = Fp8Weight::concat(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(both.dims(), (56, 64));
        let rows = |t: Tensor| t.to_vec2::<f32>().unwrap();
        let whole = rows(both.dequantize().unwrap());
        assert_eq!(whole[..32], rows(a.dequantize().unwrap())[..]);
        assert_eq!(whole[32..], rows(b.dequantize().unwrap())[..]);
        let err = Fp8Weight::concat(&[b, a]).unwrap_err().to_string();
        assert!(err.contains("part 0"), "{err}");
        let (w, _) = quantized(8, 64, (8, 32));
        let err = Fp8Weight::new(w.weight.clone(), w.scales.clone(), (8, 12))
            .unwrap_err()
            .to_string();
        assert!(err.contains("multiple of 8"), "{err}");
    }
}

//! RMSNorm, alone or fused with the residual add before it, as one op on every device.
//!
//! The CPU forward is the reference the CUDA kernel is tested against, in f32: each row's sum
//! of squares in element order, then `weight * (x * rsqrt(mean + eps))`. (CPU inference uses
//! candle's rms_norm, which computes the same.)

use crate::contiguous::contiguous;
use crate::error::bad_input;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

/// RMSNorm of each row of `x` [rows, width], times `weight` [width].
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    x.apply_op2_no_bwd(weight, &RmsNorm { eps })
}

/// `[rms_norm(a, wa), rms_norm(b, wb)]` side by side, [rows, 2 * width] for `a` and `b`
/// [rows, width]: each half's bits those of its own norm. One launch on a GPU, where the
/// concatenation would be another.
pub fn rms_norm_pair(a: &Tensor, wa: &Tensor, b: &Tensor, wb: &Tensor, eps: f32) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if a.device().is_cuda() {
        return crate::cuda::rms_norm_pair(&a.contiguous()?, wa, &b.contiguous()?, wb, eps);
    }
    Tensor::cat(&[&rms_norm(a, wa, eps)?, &rms_norm(b, wb, eps)?], 1)
}

/// `(sum, rms_norm(sum))` with `sum = x + residual`, both [rows, width], in one pass.
pub fn add_rms_norm(x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    let both = x.apply_op3_no_bwd(residual, weight, &RmsNorm { eps })?;
    Ok((both.get(1)?, both.get(0)?))
}

struct RmsNorm {
    eps: f32,
}

impl RmsNorm {
    /// The rows and width, with the weight [width] and a residual shaped as x.
    fn check(&self, xl: &Layout, rl: Option<&Layout>, wl: &Layout) -> Result<(usize, usize)> {
        let (rows, width) = xl.shape().dims2()?;
        if wl.shape().dims() != [width] || rl.is_some_and(|r| r.shape() != xl.shape()) {
            return Err(bad_input(
                "rms_norm",
                format!(
                    "x {:?}, residual {:?} and weight {:?} do not match",
                    xl.shape(),
                    rl.map(Layout::shape),
                    wl.shape()
                ),
            ));
        }
        Ok((rows, width))
    }

    fn normed(&self, x: &[f32], weight: &[f32]) -> Vec<f32> {
        let width = weight.len();
        let mut out = Vec::with_capacity(x.len());
        for row in x.chunks_exact(width) {
            let squares: f32 = row.iter().map(|v| v * v).sum();
            let inv = 1.0 / (squares / width as f32 + self.eps).sqrt();
            out.extend(row.iter().zip(weight).map(|(v, w)| w * (v * inv)));
        }
        out
    }
}

fn f32_input<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    contiguous(s.as_slice::<f32>()?, l, what)
}

impl CustomOp2 for RmsNorm {
    fn name(&self) -> &'static str {
        "peagle-rms-norm"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, width) = self.check(xl, None, wl)?;
        let out = self.normed(f32_input(xs, xl, "x")?, f32_input(ws, wl, "weight")?);
        Ok((CpuStorage::F32(out), Shape::from((rows, width))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.check(xl, None, wl)?;
        crate::cuda::rms_norm((xs, xl), None, (ws, wl), self.eps)
    }
}

/// The fused form: [2, rows, width], the normed rows then the sums.
impl CustomOp3 for RmsNorm {
    fn name(&self) -> &'static str {
        "peagle-add-rms-norm"
    }

    fn cpu_fwd(
        &self,
        xs: &CpuStorage,
        xl: &Layout,
        rs: &CpuStorage,
        rl: &Layout,
        ws: &CpuStorage,
        wl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, width) = self.check(xl, Some(rl), wl)?;
        let x = f32_input(xs, xl, "x")?;
        let sum: Vec<f32> = x
            .iter()
            .zip(f32_input(rs, rl, "residual")?)
            .map(|(a, b)| a + b)
            .collect();
        let mut out = self.normed(&sum, f32_input(ws, wl, "weight")?);
        out.extend(sum);
        Ok((CpuStorage::F32(out), Shape::from((2, rows, width))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        rs: &candle_core::CudaStorage,
        rl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.check(xl, Some(rl), wl)?;
        crate::cuda::rms_norm((xs, xl), Some((rs, rl)), (ws, wl), self.eps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn a_pair_of_norms_is_each_norm_side_by_side() {
        let dev = Device::Cpu;
        let (a, b) = (
            Tensor::randn(0f32, 1.0, (3, 40), &dev).unwrap(),
            Tensor::randn(0f32, 1.0, (3, 40), &dev).unwrap(),
        );
        let (wa, wb) = (
            Tensor::randn(1f32, 0.1, 40, &dev).unwrap(),
            Tensor::randn(1f32, 0.1, 40, &dev).unwrap(),
        );
        let pair = rms_norm_pair(&a, &wa, &b, &wb, 1e-5).unwrap();
        assert_eq!(pair.dims(), [3, 80]);
        for (half, (x, w)) in [(&a, &wa), (&b, &wb)].into_iter().enumerate() {
            let want: Vec<f32> = rms_norm(x, w, 1e-5).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let got: Vec<f32> = pair
                .narrow(1, 40 * half, 40)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            assert_eq!(got, want, "half {half}");
        }
    }

    #[test]
    fn equals_candles_rms_norm_and_fuses_the_residual() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f32, 1.0, (3, 40), &dev).unwrap();
        let r = Tensor::randn(0f32, 1.0, (3, 40), &dev).unwrap();
        let w = Tensor::randn(1f32, 0.1, 40, &dev).unwrap();
        let close = |a: &Tensor, b: &Tensor| {
            let diff: f32 = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
            assert!(diff < 1e-5, "{diff}");
        };
        close(
            &rms_norm(&x, &w, 1e-5).unwrap(),
            &candle_nn::ops::rms_norm(&x, &w, 1e-5).unwrap(),
        );
        let (sum, normed) = add_rms_norm(&x, &r, &w, 1e-5).unwrap();
        close(&sum, &(&x + &r).unwrap());
        close(&normed, &candle_nn::ops::rms_norm(&sum, &w, 1e-5).unwrap());
        let err = rms_norm(&x, &r, 1e-5).unwrap_err().to_string();
        assert!(err.contains("do not match"), "{err}");
    }
}

//! SwiGLU's gating, `silu(gate) * up`, straight from the fused gate/up projection.
//!
//! Composed from candle ops this took two views, a SiLU and a product into fresh tensors, and
//! a copy; here it is one pass. The arithmetic is candle's (`g / (1 + exp(-g))`, then the
//! product), with the crate's vectorised `exp` in place of libm's: within a few ulp of
//! candle's.

use crate::contiguous::contiguous;
use crate::error::bad_input;
use crate::exp::exp_in_place;
use crate::pool::for_each_chunk;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

/// `gate_up` [rows, 2 * width] (gate columns first) to [rows, width].
pub fn swiglu(gate_up: &Tensor) -> Result<Tensor> {
    gate_up.apply_op1_no_bwd(&SwiGlu)
}

/// gpt-oss's gating of `gate_up` [rows, 2 * width] (gate columns first):
/// `(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)` with `g = min(gate, limit)`.
pub fn clamped_swiglu(gate_up: &Tensor, alpha: f32, limit: f32) -> Result<Tensor> {
    gate_up.apply_op1_no_bwd(&ClampedSwiGlu { alpha, limit })
}

struct SwiGlu;

struct ClampedSwiGlu {
    alpha: f32,
    limit: f32,
}

impl CustomOp1 for ClampedSwiGlu {
    fn name(&self) -> &'static str {
        "peagle-clamped-swiglu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, width) = check(l)?;
        let x = contiguous(s.as_slice::<f32>()?, l, "input")?;
        let mut out = vec![0f32; rows * width];
        for_each_chunk(&mut out, width.max(1), |i, out| {
            let (gate, up) = x[i * 2 * width..][..2 * width].split_at(width);
            for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
                let g = g.min(self.limit);
                let u = u.clamp(-self.limit, self.limit);
                *o = (u + 1.0) * (g / (1.0 + (-g * self.alpha).exp()));
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((rows, width))))
    }
}

impl CustomOp1 for SwiGlu {
    fn name(&self) -> &'static str {
        "peagle-swiglu"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, width) = check(l)?;
        let x = contiguous(s.as_slice::<f32>()?, l, "input")?;
        Ok((CpuStorage::F32(gate_rows(x, width)), Shape::from((rows, width))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let (rows, width) = check(l)?;
        crate::cuda::swiglu((s, l), rows, width)
    }
}

/// SwiGLU's gating of rows of `2 * width` (gate columns first): rows of `width`.
pub(crate) fn gate_rows(x: &[f32], width: usize) -> Vec<f32> {
    let both = 2 * width;
    // Rows are tasks: a batch's rows take one exp per column each, and left to one thread
    // the other core idles long enough to fall asleep before the next matmul.
    let mut out = vec![0f32; x.len() / 2];
    for_each_chunk(&mut out, width, |i, out| {
        let (gate, up) = x[i * both..][..both].split_at(width);
        for (o, g) in out.iter_mut().zip(gate) {
            *o = -g;
        }
        exp_in_place(out);
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + *o) * u;
        }
    });
    out
}

/// The rows and the width of each half.
fn check(l: &Layout) -> Result<(usize, usize)> {
    let (rows, both) = l.shape().dims2()?;
    if both % 2 != 0 {
        return Err(bad_input(
            "swiglu",
            format!("{both} columns do not split into gate and up"),
        ));
    }
    Ok((rows, both / 2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn equals_candles_silu_times_up_within_a_few_ulp() {
        // Gates across the range where exp(-g) is finite and beyond; ups of either sign.
        let values: Vec<f32> = (0..4 * 2 * 40).map(|i| (i as f32 * 0.731).sin() * 95.0).collect();
        let x = Tensor::from_vec(values, (4, 2 * 40), &Device::Cpu).unwrap();
        let ours: Vec<Vec<f32>> = swiglu(&x).unwrap().to_vec2().unwrap();
        let (gate, up) = (x.narrow(1, 0, 40).unwrap(), x.narrow(1, 40, 40).unwrap());
        let theirs: Vec<Vec<f32>> = (gate.silu().unwrap() * up).unwrap().to_vec2().unwrap();
        for (a, b) in ours.iter().flatten().zip(theirs.iter().flatten()) {
            assert!((a - b).abs() <= 1e-6 * b.abs(), "ours {a}, candle {b}");
        }
    }

    #[test]
    fn clamped_swiglu_clamps_gate_above_and_up_both_ways() {
        let x = Tensor::from_vec(vec![1.0f32, 9.0, -3.0, 0.5, -20.0, 9.0], (1, 6), &Device::Cpu).unwrap();
        let out: Vec<f32> = clamped_swiglu(&x, 1.702, 7.0)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let glu = |g: f32| g / (1.0 + (-1.702 * g).exp());
        let want = [(0.5 + 1.0) * glu(1.0), (-7.0 + 1.0) * glu(7.0), (7.0 + 1.0) * glu(-3.0)];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-6, "{o} vs {w}");
        }
    }

    #[test]
    fn an_odd_width_is_an_error() {
        let x = Tensor::zeros((2, 7), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(swiglu(&x).unwrap_err().to_string().contains("7 columns"));
    }
}

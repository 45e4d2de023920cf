//! Softmax over the last dimension after adding a mask, with a backward: the attention of the
//! multi-depth training layout, whose [heads, rows, rows] scores dominate a training step's
//! memory. Fusing the mask and the normalisation keeps one such tensor per step instead of
//! the five that composed ops allocate.

use crate::contiguous::contiguous;
use crate::error::bad_input;
use crate::exp::{exp_sum, row_max};
use crate::pool::for_each_chunk;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor, D};

/// `softmax(scores + bias)` over the last dimension; `scores` [.., rows, cols] f32, `bias`
/// [rows, cols] (0 where visible, -inf elsewhere) shared by every leading index. A row with
/// nothing visible comes out as zeros. Differentiable in `scores`. The fused kernel is CPU
/// code; other devices take [`composed_masked_softmax`].
pub fn masked_softmax(scores: &Tensor, bias: &Tensor) -> Result<Tensor> {
    if !scores.device().is_cpu() {
        return composed_masked_softmax(scores, bias);
    }
    scores
        .contiguous()?
        .apply_op2_arc(&bias.contiguous()?, std::sync::Arc::new(Box::new(MaskedSoftmax)))
}

/// [`masked_softmax`] from differentiable candle ops, for any device. The row maximum is held
/// finite and the sum away from zero so that a fully masked row gives zeros, not NaN.
fn composed_masked_softmax(scores: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let x = scores.broadcast_add(bias)?;
    let max = x.max_keepdim(D::Minus1)?.detach().maximum(f32::MIN)?;
    let e = x.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?.maximum(f32::MIN_POSITIVE)?;
    e.broadcast_div(&sum)
}

struct MaskedSoftmax;

impl CustomOp2 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "peagle-masked-softmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, s_l: &Layout, b: &CpuStorage, b_l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, cols) = b_l.shape().dims2()?;
        let dims = s_l.shape().dims();
        if dims.len() < 2 || dims[dims.len() - 2..] != [rows, cols] {
            return Err(bad_input(
                "masked_softmax",
                format!("scores {dims:?} do not end in the mask's [{rows}, {cols}]"),
            ));
        }
        let scores = contiguous(s.as_slice::<f32>()?, s_l, "scores")?;
        let bias = contiguous(b.as_slice::<f32>()?, b_l, "mask")?;
        let mut out = vec![0f32; scores.len()];
        for_each_chunk(&mut out, cols, |i, y| {
            let x = &scores[i * cols..][..cols];
            let mask = &bias[(i % rows) * cols..][..cols];
            for ((o, v), m) in y.iter_mut().zip(x).zip(mask) {
                *o = v + m;
            }
            let max = row_max(y);
            if max == f32::NEG_INFINITY {
                y.fill(0.0);
                return;
            }
            let sum = exp_sum(y, max);
            y.iter_mut().for_each(|o| *o /= sum);
        });
        Ok((CpuStorage::F32(out), s_l.shape().clone()))
    }

    fn bwd(
        &self,
        _scores: &Tensor,
        _bias: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // d/dx softmax: y * (g - sum(g * y)).
        let gy = (grad * res)?;
        let sum = gy.sum_keepdim(D::Minus1)?;
        Ok((Some((gy - res.broadcast_mul(&sum)?)?), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn equals_composed_softmax_forward_and_backward() {
        let dev = Device::Cpu;
        let x = Var::from_tensor(&Tensor::randn(0f32, 2.0, (3, 5, 5), &dev).unwrap()).unwrap();
        let mask: Vec<f32> = (0..25)
            .map(|i| if i % 5 <= i / 5 { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        let bias = Tensor::from_vec(mask, (5, 5), &dev).unwrap();
        let weights = Tensor::randn(0f32, 1.0, (3, 5, 5), &dev).unwrap();
        let fused = masked_softmax(x.as_tensor(), &bias).unwrap();
        let composed = composed_masked_softmax(x.as_tensor(), &bias).unwrap();
        let diff = |a: &Tensor, b: &Tensor| {
            (a - b)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        };
        assert!(diff(&fused, &composed) < 1e-6);
        let g1 = (fused * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = (composed * &weights).unwrap().sum_all().unwrap().backward().unwrap();
        let (g1, g2) = (g1.get(x.as_tensor()).unwrap(), g2.get(x.as_tensor()).unwrap());
        assert!(diff(g1, g2) < 1e-6, "gradients differ by {}", diff(g1, g2));
    }

    #[test]
    fn a_fully_masked_row_is_zeros_on_both_paths() {
        let dev = Device::Cpu;
        let scores = Tensor::randn(0f32, 1.0, (2, 3, 3), &dev).unwrap();
        let (inf, o) = (f32::NEG_INFINITY, 0.0);
        let bias = Tensor::from_vec(vec![inf, inf, inf, o, inf, inf, o, o, inf], (3, 3), &dev).unwrap();
        for out in [
            masked_softmax(&scores, &bias).unwrap(),
            composed_masked_softmax(&scores, &bias).unwrap(),
        ] {
            let rows = out.to_vec3::<f32>().unwrap();
            for head in rows {
                assert_eq!(head[0], [0.0, 0.0, 0.0]);
                assert_eq!(head[1], [1.0, 0.0, 0.0]);
                assert!((head[2][0] + head[2][1] - 1.0).abs() < 1e-6 && head[2][2] == 0.0);
            }
        }
    }
}

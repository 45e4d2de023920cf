//! Softmax over the last dimension after adding a mask, with a backward: the attention of the
//! multi-depth training layout, whose [heads, rows, rows] scores dominate a training step's
//! memory. Fusing the mask and the normalisation keeps one such tensor per step instead of
//! the five that composed ops allocate.

use crate::error::bad_input;
use crate::linear::contiguous;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

/// `softmax(scores + bias)` over the last dimension; `scores` [.., rows, cols] f32, `bias`
/// [rows, cols] (0 where visible, -inf elsewhere) shared by every leading index. A row with
/// nothing visible comes out as zeros. Differentiable in `scores`.
pub fn masked_softmax(scores: &Tensor, bias: &Tensor) -> Result<Tensor> {
    scores
        .contiguous()?
        .apply_op2_arc(&bias.contiguous()?, std::sync::Arc::new(Box::new(MaskedSoftmax)))
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
        out.par_chunks_mut(cols)
            .zip(scores.par_chunks(cols))
            .enumerate()
            .for_each(|(i, (y, x))| {
                let mask = &bias[(i % rows) * cols..][..cols];
                let max = x.iter().zip(mask).map(|(v, m)| v + m).fold(f32::NEG_INFINITY, f32::max);
                if max == f32::NEG_INFINITY {
                    return;
                }
                let mut sum = 0f32;
                for ((o, v), m) in y.iter_mut().zip(x).zip(mask) {
                    *o = (v + m - max).exp();
                    sum += *o;
                }
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
        let composed = candle_nn_softmax(&x.as_tensor().broadcast_add(&bias).unwrap());
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

    /// exp(x - max) / sum over the last dimension, from differentiable candle ops.
    fn candle_nn_softmax(x: &Tensor) -> Tensor {
        let max = x.max_keepdim(D::Minus1).unwrap();
        let e = x.broadcast_sub(&max).unwrap().exp().unwrap();
        let sum = e.sum_keepdim(D::Minus1).unwrap();
        e.broadcast_div(&sum).unwrap()
    }
}

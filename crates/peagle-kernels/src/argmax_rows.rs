//! Each row's argmax, computed where the rows are: greedy verification of logits on a GPU
//! brings one token id per row to the host instead of the rows themselves.

use crate::contiguous::contiguous;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

/// `x` [rows, cols] (f32; f32 or bf16 on CUDA) to u32 [rows]: the first index of each row's
/// largest value, as a scan in index order finds it. NaN is never chosen; a row with nothing
/// else gives 0.
pub fn argmax_rows(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(&ArgmaxRows)
}

struct ArgmaxRows;

impl CustomOp1 for ArgmaxRows {
    fn name(&self) -> &'static str {
        "peagle-argmax-rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, cols) = l.shape().dims2()?;
        let x = contiguous(s.as_slice::<f32>()?, l, "x")?;
        let out = x.chunks_exact(cols.max(1)).take(rows).map(first_largest).collect();
        Ok((CpuStorage::U32(out), Shape::from(rows)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::argmax_rows((s, l))
    }
}

fn first_largest(row: &[f32]) -> u32 {
    let mut pick: Option<(usize, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        if pick.is_none_or(|(_, best)| v > best) && !v.is_nan() {
            pick = Some((i, v));
        }
    }
    pick.map_or(0, |(i, _)| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_first_largest_value_wins_and_nan_never_does() {
        let nan = f32::NAN;
        let inf = f32::INFINITY;
        let rows = [
            [1.0, 3.0, 3.0, 2.0],
            [nan, 1.0, nan, 1.0],
            [-inf, -inf, -inf, -inf],
            [nan, nan, nan, nan],
            [0.0, inf, nan, inf],
        ];
        let x = Tensor::from_vec(rows.concat(), (5, 4), &Device::Cpu).unwrap();
        assert_eq!(argmax_rows(&x).unwrap().to_vec1::<u32>().unwrap(), [1, 1, 0, 0, 1]);
        // Any layout is read in order.
        let strided = x.t().unwrap().contiguous().unwrap().t().unwrap();
        assert_eq!(
            argmax_rows(&strided).unwrap().to_vec1::<u32>().unwrap(),
            [1, 1, 0, 0, 1]
        );
    }
}

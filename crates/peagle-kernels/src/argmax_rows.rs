//! The argmax of chosen rows, computed where the rows are: greedy verification of logits on a
//! GPU reads only its greedy rows and brings one token id per row to the host instead of the
//! rows themselves.

use crate::contiguous::contiguous;
use crate::error::bad_input;
use crate::requested_rows::{apply_to_rows, apply_where, Issued};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor};

/// The argmax of each of `rows` of `x` [rows, cols] (f32 or bf16): the first index of the
/// row's largest value, as a scan in index order finds it. NaN is never chosen; a row with
/// nothing else gives 0.
pub fn argmax_rows(x: &Tensor, rows: &[u32]) -> Result<Vec<u32>> {
    issue_argmax_rows(x, rows)?.read()
}

/// `argmax_rows`, issued where `x` is and read later.
pub fn issue_argmax_rows(x: &Tensor, rows: &[u32]) -> Result<Issued<u32>> {
    let words = match rows.is_empty() {
        // No launch, and no allocation a GPU would refuse.
        true => Tensor::zeros(0, DType::U32, &Device::Cpu)?,
        false => {
            let op = ArgmaxRows { rows: rows.to_vec() };
            apply_to_rows("argmax_rows", x, rows.iter().map(|&r| r as usize), &op)?
        }
    };
    Ok(Issued::tokens(words))
}

/// The argmax of every row of `x` [rows, cols] (f32 or bf16, at least one row), as
/// `argmax_rows` finds it, left on `x`'s device: u32 [rows]. A GPU uploads nothing for it, so a
/// CUDA graph can capture it.
pub fn argmax_each_row(x: &Tensor) -> Result<Tensor> {
    let (rows, _) = x.dims2()?;
    if rows == 0 {
        return Err(bad_input("argmax_each_row", "no rows"));
    }
    let op = ArgmaxRows {
        rows: (0..rows as u32).collect(),
    };
    apply_where(x, &op)
}

struct ArgmaxRows {
    rows: Vec<u32>,
}

impl CustomOp1 for ArgmaxRows {
    fn name(&self) -> &'static str {
        "peagle-argmax-rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let cols = l.shape().dims2()?.1;
        let x = contiguous(s.as_slice::<f32>()?, l, "x")?;
        let out = self
            .rows
            .iter()
            .map(|&r| first_largest(&x[r as usize * cols..][..cols]))
            .collect();
        Ok((CpuStorage::U32(out), Shape::from(self.rows.len())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        crate::cuda::argmax_rows((s, l), &self.rows)
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
    use candle_core::{DType, Device};

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
        assert_eq!(argmax_rows(&x, &[0, 1, 2, 3, 4]).unwrap(), [1, 1, 0, 0, 1]);
        // Only the rows asked for, in the order asked, from any layout; a row outside is an
        // error.
        let strided = x.t().unwrap().contiguous().unwrap().t().unwrap();
        assert_eq!(argmax_rows(&strided, &[4, 0, 4]).unwrap(), [1, 1, 1]);
        assert_eq!(argmax_rows(&x, &[]).unwrap(), Vec::<u32>::new());
        let err = argmax_rows(&x, &[1, 5]).unwrap_err().to_string();
        assert!(err.contains("row 5 of 5"), "{err}");
        let each = argmax_each_row(&strided.to_dtype(DType::BF16).unwrap()).unwrap();
        assert_eq!(each.to_vec1::<u32>().unwrap(), [1, 1, 0, 0, 1]);
        let err = argmax_each_row(&x.narrow(0, 0, 0).unwrap()).unwrap_err().to_string();
        assert!(err.contains("no rows"), "{err}");
    }
}

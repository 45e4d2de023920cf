//! `y = x · wᵀ` with one fixed-order dot product per output element.
//!
//! Decoding multiplies a handful of rows by every weight matrix, so this is the hot path and it
//! is memory-bound: each weight row is read once per call and reused for all input rows while it
//! is in cache. Work is split across threads by weight rows, which never changes a reduction.

use crate::dot::{dot_bf16, dot_bf16_x4, dot_f32, dot_f32_x4};
use crate::error::bad_input;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Tasks per thread: a few, so uneven progress balances out, but not so many that rayon's
/// per-task cost rivals a task's work (a 16-row task of a small matmul is about a microsecond).
const TASKS_PER_THREAD: usize = 4;
/// The fewest weight rows worth a task of their own.
const MIN_WEIGHT_ROWS_PER_TASK: usize = 16;

/// `x` [rows, k] f32 times `w` [n, k] (f32 or bf16) transposed, giving [rows, n] f32.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.apply_op2_no_bwd(w, &Linear)
}

struct Linear;

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "peagle-linear"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, k) = xl.shape().dims2()?;
        let (n, wk) = wl.shape().dims2()?;
        if k != wk {
            return Err(bad_input(
                "linear",
                format!("input has {k} columns but the weight has {wk}"),
            ));
        }
        let x = contiguous(xs.as_slice::<f32>()?, xl, "input")?;
        let y = match ws {
            CpuStorage::F32(w) => matmul(x, contiguous(w, wl, "weight")?, rows, n, k, (dot_f32, dot_f32_x4)),
            CpuStorage::BF16(w) => matmul(x, contiguous(w, wl, "weight")?, rows, n, k, (dot_bf16, dot_bf16_x4)),
            other => {
                let dtype = other.dtype();
                return Err(bad_input("linear", format!("unsupported weight dtype {dtype:?}")));
            }
        };
        Ok((CpuStorage::F32(y), Shape::from((rows, n))))
    }
}

pub(crate) fn contiguous<'a, T>(data: &'a [T], layout: &Layout, what: &str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => Err(bad_input("peagle kernel", format!("{what} must be contiguous"))),
    }
}

/// A dot product for one row and one for four rows at once, bit-identical per row.
type Dots<W> = (fn(&[f32], &[W]) -> f32, fn([&[f32]; 4], &[W]) -> [f32; 4]);

fn matmul<W: Sync>(x: &[f32], w: &[W], rows: usize, n: usize, k: usize, (dot, dot4): Dots<W>) -> Vec<f32> {
    if rows == 0 || n == 0 {
        return vec![0.0; rows * n];
    }
    // Computed transposed ([n, rows]) so that each task owns a contiguous output chunk.
    let per_task = n
        .div_ceil(TASKS_PER_THREAD * rayon::current_num_threads())
        .max(MIN_WEIGHT_ROWS_PER_TASK);
    let mut yt = vec![0f32; n * rows];
    yt.par_chunks_mut(per_task * rows).enumerate().for_each(|(chunk, out)| {
        let first = chunk * per_task;
        for (j, out_row) in out.chunks_mut(rows).enumerate() {
            let wr = &w[(first + j) * k..][..k];
            let x_row = |t: usize| &x[t * k..][..k];
            let mut quads = out_row.chunks_exact_mut(4);
            for (q, o) in quads.by_ref().enumerate() {
                let t = 4 * q;
                o.copy_from_slice(&dot4([x_row(t), x_row(t + 1), x_row(t + 2), x_row(t + 3)], wr));
            }
            let done = rows / 4 * 4;
            for (t, o) in quads.into_remainder().iter_mut().enumerate() {
                *o = dot(x_row(done + t), wr);
            }
        }
    });
    if rows == 1 {
        return yt;
    }
    let mut y = vec![0f32; rows * n];
    for (j, col) in yt.chunks(rows).enumerate() {
        for (t, v) in col.iter().enumerate() {
            y[t * n + j] = *v;
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn random(rows: usize, cols: usize, seed: u64) -> Tensor {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let data: Vec<f32> = (0..rows * cols)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect();
        Tensor::from_vec(data, (rows, cols), &Device::Cpu).unwrap()
    }

    #[test]
    fn matches_candle_matmul() {
        let x = random(5, 70, 1);
        let w = random(33, 70, 2);
        let ours = linear(&x, &w).unwrap();
        let reference = x.matmul(&w.t().unwrap()).unwrap();
        let diff = (ours - reference).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-5);
    }

    #[test]
    fn rows_are_bitwise_independent_of_batch_size() {
        let w = random(67, 96, 3);
        let x = random(9, 96, 4);
        let all: Vec<Vec<f32>> = linear(&x, &w).unwrap().to_vec2().unwrap();
        for (t, row) in all.iter().enumerate() {
            let alone: Vec<Vec<f32>> = linear(&x.narrow(0, t, 1).unwrap(), &w).unwrap().to_vec2().unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&alone[0]), bits(row), "row {t}");
        }
    }

    #[test]
    fn bf16_weights_equal_their_f32_upcast() {
        let x = random(3, 40, 5);
        let w16 = random(20, 40, 6).to_dtype(DType::BF16).unwrap();
        let w32 = w16.to_dtype(DType::F32).unwrap();
        let a: Vec<Vec<f32>> = linear(&x, &w16).unwrap().to_vec2().unwrap();
        let b: Vec<Vec<f32>> = linear(&x, &w32).unwrap().to_vec2().unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn mismatched_inner_dimension_is_an_error() {
        let err = linear(&random(2, 8, 1), &random(4, 9, 2)).unwrap_err();
        assert!(err.to_string().contains("8 columns"), "{err}");
    }
}

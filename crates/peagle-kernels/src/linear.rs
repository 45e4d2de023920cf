//! `y = x · wᵀ` with one fixed-order dot product per output element.
//!
//! Decoding multiplies a handful of rows by every weight matrix, so this is the hot path and it
//! is memory-bound: each weight row is read once per call and reused for all input rows while it
//! is in cache. Work is split across threads by weight rows, which never changes a reduction.

use crate::dot::{dot_bf16, dot_bf16_x4, dot_bf16_x4x2, dot_f32, dot_f32_x4, dot_f32_x4x2};
use crate::error::bad_input;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};
use half::bf16;
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
            CpuStorage::F32(w) => matmul(x, contiguous(w, wl, "weight")?, rows, n, k, &F32_DOTS),
            CpuStorage::BF16(w) => matmul(x, contiguous(w, wl, "weight")?, rows, n, k, &BF16_DOTS),
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

/// Four input rows against two weight rows: `[row][weight]`.
type Tile<W> = fn([&[f32]; 4], [&[W]; 2]) -> [[f32; 2]; 4];

/// Dot products for one row, for four rows, and for four rows against two weight rows, all
/// bit-identical per (row, weight) pair.
struct Dots<W> {
    one: fn(&[f32], &[W]) -> f32,
    four: fn([&[f32]; 4], &[W]) -> [f32; 4],
    four_by_two: Tile<W>,
}

const F32_DOTS: Dots<f32> = Dots {
    one: dot_f32,
    four: dot_f32_x4,
    four_by_two: dot_f32_x4x2,
};

const BF16_DOTS: Dots<bf16> = Dots {
    one: dot_bf16,
    four: dot_bf16_x4,
    four_by_two: dot_bf16_x4x2,
};

fn matmul<W: Sync>(x: &[f32], w: &[W], rows: usize, n: usize, k: usize, dots: &Dots<W>) -> Vec<f32> {
    if rows == 0 || n == 0 {
        return vec![0.0; rows * n];
    }
    let per_task = n
        .div_ceil(TASKS_PER_THREAD * rayon::current_num_threads())
        .max(MIN_WEIGHT_ROWS_PER_TASK);
    let blocks: Vec<Vec<f32>> = (0..n.div_ceil(per_task))
        .into_par_iter()
        .map(|task| {
            let first = task * per_task;
            block(x, &w[first * k..], rows, per_task.min(n - first), k, dots)
        })
        .collect();
    if rows == 1 {
        return blocks.concat();
    }
    // Row by row, so every copy is contiguous. (Writing the output column by column strided by
    // n, a power of two for most weights, mapped every row to one L1 set; at 16 rows that took
    // as long as the matmul itself.)
    let mut y = vec![0f32; rows * n];
    y.par_chunks_mut(n).enumerate().for_each(|(t, y_row)| {
        for (y_part, block) in y_row.chunks_mut(per_task).zip(&blocks) {
            y_part.copy_from_slice(&block[t * y_part.len()..][..y_part.len()]);
        }
    });
    y
}

/// `x` [rows, k] times the first `cols` rows of `w` transposed, as [rows, cols].
fn block<W>(x: &[f32], w: &[W], rows: usize, cols: usize, k: usize, dots: &Dots<W>) -> Vec<f32> {
    let x_row = |t: usize| &x[t * k..][..k];
    let w_row = |j: usize| &w[j * k..][..k];
    let mut out = vec![0f32; rows * cols];
    let quads = rows / 4;
    // Weight rows in pairs, input rows in fours: each loaded block serves a 4x2 tile.
    for j in (0..cols).step_by(2) {
        let pair = j + 1 < cols;
        for q in 0..quads {
            let t = 4 * q;
            let xs = [x_row(t), x_row(t + 1), x_row(t + 2), x_row(t + 3)];
            if pair {
                let tile = (dots.four_by_two)(xs, [w_row(j), w_row(j + 1)]);
                for (r, v) in tile.iter().enumerate() {
                    out[(t + r) * cols + j..][..2].copy_from_slice(v);
                }
            } else {
                for (r, v) in (dots.four)(xs, w_row(j)).iter().enumerate() {
                    out[(t + r) * cols + j] = *v;
                }
            }
        }
        for c in j..(j + 1 + pair as usize) {
            for t in 4 * quads..rows {
                out[t * cols + c] = (dots.one)(x_row(t), w_row(c));
            }
        }
    }
    out
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

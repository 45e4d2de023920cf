//! The CPU product of f32 rows and a quantized weight, a few dequantized weight rows at a time:
//! the weight stays packed in memory and each of its rows exists in f32 only in a task's buffer.

use crate::dot::dots;
use crate::pool::for_each_chunk;

/// Weight rows dequantized together. Each output element is one chain of dependent
/// multiply-adds (`dots`), so a decode row against one weight row waits on the adds' latency;
/// against four, their chains overlap, and two input rows against four make eight chains.
const ROWS_AT_ONCE: usize = 4;

/// Output columns per task, whole groups of `ROWS_AT_ONCE`.
const COLUMNS_PER_TASK: usize = 2 * ROWS_AT_ONCE;

/// `x` [rows, in] times the weight [out, in] transposed, [rows, out], where `row(r, buf)` writes
/// the weight's row `r` in f32 into `buf` [in]. Each output element is one `dots` of its input
/// row and weight row, whose bits depend on those two alone, so rows are batch invariant.
pub(crate) fn dequantized_linear(
    x: &[f32],
    rows: usize,
    (out_dim, in_dim): (usize, usize),
    row: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    // Tasks own column ranges of the transposed result [out, rows], then it is turned.
    let mut by_column = vec![0f32; out_dim * rows];
    for_each_chunk(&mut by_column, COLUMNS_PER_TASK * rows, |task, out| {
        let mut w = vec![0f32; ROWS_AT_ONCE * in_dim];
        for (group, out) in out.chunks_mut(ROWS_AT_ONCE * rows).enumerate() {
            let first = task * COLUMNS_PER_TASK + group * ROWS_AT_ONCE;
            let columns = out.len() / rows;
            for (c, buf) in w.chunks_exact_mut(in_dim.max(1)).take(columns).enumerate() {
                row(first + c, buf);
            }
            let w: Vec<&[f32]> = w.chunks_exact(in_dim.max(1)).take(columns).collect();
            for (pair, x_rows) in x.chunks(2 * in_dim.max(1)).enumerate() {
                let sums = pair_sums(x_rows, in_dim, &w);
                for (i, sums) in sums.into_iter().take(x_rows.len() / in_dim.max(1)).enumerate() {
                    let r = 2 * pair + i;
                    for (c, sum) in sums.into_iter().enumerate().take(columns) {
                        out[c * rows + r] = sum;
                    }
                }
            }
        }
    });
    let mut out = vec![0f32; rows * out_dim];
    for (c, column) in by_column.chunks_exact(rows.max(1)).enumerate() {
        for (r, v) in column.iter().enumerate() {
            out[r * out_dim + c] = *v;
        }
    }
    out
}

/// The dot products of one or two input rows `x_rows` [rows, in_dim] with the weight rows `w`
/// (up to `ROWS_AT_ONCE`), a row of sums an input row; zeros past them.
fn pair_sums(x_rows: &[f32], in_dim: usize, w: &[&[f32]]) -> [[f32; ROWS_AT_ONCE]; 2] {
    let xs: Vec<&[f32]> = x_rows.chunks_exact(in_dim.max(1)).collect();
    match (&xs[..], w) {
        (&[x0, x1], &[a, b, c, d]) => dots::<f32, 2, ROWS_AT_ONCE>([x0, x1], [a, b, c, d]),
        (&[x0], &[a, b, c, d]) => [dots::<f32, 1, ROWS_AT_ONCE>([x0], [a, b, c, d])[0], [0.0; ROWS_AT_ONCE]],
        _ => std::array::from_fn(|r| {
            std::array::from_fn(|c| match (xs.get(r), w.get(c)) {
                (Some(x), Some(w)) => dots::<f32, 1, 1>([x], [w])[0][0],
                _ => 0.0,
            })
        }),
    }
}

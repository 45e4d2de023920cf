//! The CPU product of f32 rows and a quantized weight, one dequantized weight row at a time: the
//! weight stays packed in memory and each of its rows exists in f32 only in a task's buffer.

use crate::dot::dots;
use crate::pool::for_each_chunk;

/// Output columns per task: one dequantized weight row is reused for every input row.
const COLUMNS_PER_TASK: usize = 8;

/// `x` [rows, in] times the weight [out, in] transposed, [rows, out], where `row(r, buf)` writes
/// the weight's row `r` in f32 into `buf` [in]. Each output element is one `dots` of its input
/// row and weight row, whose order depends on the length alone, so rows are batch invariant.
pub(crate) fn dequantized_linear(
    x: &[f32],
    rows: usize,
    (out_dim, in_dim): (usize, usize),
    row: impl Fn(usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    // Tasks own column ranges of the transposed result [out, rows], then it is turned.
    let mut by_column = vec![0f32; out_dim * rows];
    for_each_chunk(&mut by_column, COLUMNS_PER_TASK * rows, |task, out| {
        let mut w_row = vec![0f32; in_dim];
        for (c, out) in out.chunks_exact_mut(rows.max(1)).enumerate() {
            row(task * COLUMNS_PER_TASK + c, &mut w_row);
            for (o, x_row) in out.iter_mut().zip(x.chunks_exact(in_dim.max(1))) {
                *o = dots::<f32, 1, 1>([x_row], [&w_row])[0][0];
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

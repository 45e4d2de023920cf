//! The CPU product of f32 rows and a quantized weight, a few dequantized weight rows at a time:
//! the weight stays packed in memory and each of its rows exists in f32 only in a task's buffer.

use crate::dot::dots;
use crate::pool::for_each_chunk;

/// Weight rows dequantized together. Each output element is one chain of dependent
/// multiply-adds (`dots`), so a decode row against one weight row waits on the adds' latency;
/// against four, their chains overlap, and two input rows against four make eight chains.
pub(crate) const ROWS_AT_ONCE: usize = 4;

/// Output columns per task, whole groups of `ROWS_AT_ONCE`.
const COLUMNS_PER_TASK: usize = 2 * ROWS_AT_ONCE;

/// The dot products of one or two input rows with a group's weight rows, a row of sums an input
/// row (zeros for a missing second).
pub(crate) type GroupSums = [[f32; ROWS_AT_ONCE]; 2];

/// `x` [rows, in] times the weight [out, in] transposed, [rows, out], where `row(r, buf)` writes
/// the weight's row `r` in f32 into `buf` [in]. Each output element is one `dots` of its input
/// row and weight row, whose bits depend on those two alone, so rows are batch invariant.
///
/// Where `x` has one or two rows, each weight row meets only them, and `in_registers(x0, x1,
/// first)` may give a whole group's sums (weight rows `first..first + ROWS_AT_ONCE`) with the
/// same bits, its rows dequantized where they are used rather than into the buffer; None takes
/// the buffer.
pub(crate) fn dequantized_linear(
    x: &[f32],
    rows: usize,
    (out_dim, in_dim): (usize, usize),
    row: impl Fn(usize, &mut [f32]) + Sync,
    in_registers: impl Fn(&[f32], Option<&[f32]>, usize) -> Option<GroupSums> + Sync,
) -> Vec<f32> {
    // Tasks own column ranges of the transposed result [out, rows], then it is turned.
    let mut by_column = vec![0f32; out_dim * rows];
    for_each_chunk(&mut by_column, COLUMNS_PER_TASK * rows, |task, out| {
        let mut w = vec![0f32; ROWS_AT_ONCE * in_dim];
        for (group, out) in out.chunks_mut(ROWS_AT_ONCE * rows).enumerate() {
            let first = task * COLUMNS_PER_TASK + group * ROWS_AT_ONCE;
            let columns = out.len() / rows;
            let sums_in_registers = (rows <= 2 && columns == ROWS_AT_ONCE)
                .then(|| {
                    let (x0, x1) = x.split_at(in_dim);
                    in_registers(x0, (rows == 2).then_some(x1), first)
                })
                .flatten();
            if sums_in_registers.is_none() {
                for (c, buf) in w.chunks_exact_mut(in_dim.max(1)).take(columns).enumerate() {
                    row(first + c, buf);
                }
            }
            // A short last group dots the buffer's stale rows too, and drops their sums.
            let w: [&[f32]; ROWS_AT_ONCE] = std::array::from_fn(|c| &w[c * in_dim..][..in_dim]);
            for (pair, x_rows) in x.chunks(2 * in_dim.max(1)).enumerate() {
                // With sums in registers, x is this one pair.
                let (sums, count) = match sums_in_registers {
                    Some(sums) => (sums, rows),
                    None => pair_sums(x_rows, in_dim, w),
                };
                for (i, sums) in sums.into_iter().take(count).enumerate() {
                    for (c, sum) in sums.into_iter().enumerate().take(columns) {
                        out[c * rows + 2 * pair + i] = sum;
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

/// The dot products of the one or two input rows `x_rows` [1 or 2, in_dim] with the weight rows
/// `w`, a row of sums an input row, and how many input rows there are.
fn pair_sums(x_rows: &[f32], in_dim: usize, w: [&[f32]; ROWS_AT_ONCE]) -> (GroupSums, usize) {
    if x_rows.len() > in_dim {
        let (x0, x1) = x_rows.split_at(in_dim);
        (dots::<f32, 2, ROWS_AT_ONCE>([x0, x1], w), 2)
    } else {
        ([dots::<f32, 1, ROWS_AT_ONCE>([x_rows], w)[0], [0.0; ROWS_AT_ONCE]], 1)
    }
}

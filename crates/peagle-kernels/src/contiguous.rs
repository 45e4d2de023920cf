//! The layouts the kernels read: contiguous, or (where a kernel says so) rows of contiguous
//! elements at any stride, such as a column range of a fused projection.

use crate::error::bad_input;
use candle_core::{Layout, Result};

/// The elements of a contiguous `layout` over `data`; any other layout is an error naming
/// `what`. Every kernel reads its inputs as plain row-major slices.
pub(crate) fn contiguous<'a, T>(data: &'a [T], layout: &Layout, what: &str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => Err(bad_input("peagle kernel", format!("{what} must be contiguous"))),
    }
}

/// The rows of a [rows, width] `layout` whose rows may be strided but whose elements must not
/// be: where its first row starts and how far apart rows are, in elements. Any other layout
/// is an error naming `op` and `what`.
pub(crate) fn strided_rows(layout: &Layout, op: &'static str, what: &str) -> Result<(usize, usize)> {
    let (_, width) = layout.shape().dims2()?;
    if layout.stride()[1] != 1 && width > 1 {
        return Err(bad_input(
            op,
            format!("{what}: the elements of a row must be contiguous"),
        ));
    }
    Ok((layout.start_offset(), layout.stride()[0]))
}

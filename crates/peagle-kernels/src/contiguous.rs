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

/// Where the rows of a [rows, width] tensor lie in its storage: rows of contiguous elements,
/// `stride` elements apart, the first at `start`.
pub(crate) struct StridedRows {
    pub start: usize,
    pub stride: usize,
    pub width: usize,
}

impl StridedRows {
    /// Row `t` of the storage `data`.
    pub fn row<'a, T>(&self, data: &'a [T], t: usize) -> &'a [T] {
        &data[self.start + t * self.stride..][..self.width]
    }
}

/// The rows of a [rows, width] `layout` whose rows may be strided (a column range of a wider
/// tensor) but whose elements must not be; any other layout is an error naming `op` and
/// `what`.
pub(crate) fn strided_rows(layout: &Layout, op: &'static str, what: &str) -> Result<StridedRows> {
    let (_, width) = layout.shape().dims2()?;
    if layout.stride()[1] != 1 && width > 1 {
        return Err(bad_input(
            op,
            format!("{what}: the elements of a row must be contiguous"),
        ));
    }
    Ok(StridedRows {
        start: layout.start_offset(),
        stride: layout.stride()[0],
        width,
    })
}

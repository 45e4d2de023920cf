//! The one layout the kernels read.

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

use thiserror::Error;

/// Invalid inputs to a kernel: a caller bug, reported instead of reading out of bounds.
#[derive(Debug, Error)]
pub enum KernelError {
    #[error("{op}: {msg}")]
    BadInput { op: &'static str, msg: String },
}

pub(crate) fn bad_input(op: &'static str, msg: impl Into<String>) -> candle_core::Error {
    candle_core::Error::wrap(KernelError::BadInput { op, msg: msg.into() })
}

/// The shapes of `x` [rows, k] and a weight [n, k] as a matmul's: (rows, k, n), or the error
/// naming both widths.
pub(crate) fn matmul_dims(
    op: &'static str,
    x: &candle_core::Shape,
    w: &candle_core::Shape,
) -> candle_core::Result<(usize, usize, usize)> {
    let (rows, k) = x.dims2()?;
    let (n, w_k) = w.dims2()?;
    if k != w_k {
        return Err(bad_input(op, format!("x has {k} columns, the weight {w_k}")));
    }
    Ok((rows, k, n))
}

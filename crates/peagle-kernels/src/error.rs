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

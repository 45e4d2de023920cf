//! Helpers of the kernels' unit tests.

use candle_core::Tensor;

/// The largest absolute difference between two tensors of one shape.
pub(crate) fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap()
}

/// All of a tensor's values, in order.
pub(crate) fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

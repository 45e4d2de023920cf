//! Tensors of no rows on any device.

use candle_core::{DType, Device, Result, Tensor};

/// A [0, cols] tensor of `dtype` on `device`, made by copying nothing from the host: CUDA
/// refuses a kernel launch over no elements, which candle's ops on an empty tensor attempt
/// (a fill, a cast), so an op with no rows to compute returns this instead of running.
pub fn no_rows(cols: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    Tensor::zeros((0, cols), dtype, &Device::Cpu)?.to_device(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_rows_has_the_shape_and_dtype_asked_for() {
        let t = no_rows(7, DType::BF16, &Device::Cpu).unwrap();
        assert_eq!((t.dims(), t.dtype()), (&[0, 7][..], DType::BF16));
    }
}

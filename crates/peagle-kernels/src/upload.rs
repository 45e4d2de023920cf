//! Host values written into a tensor that already exists: a CUDA graph's inputs, which each
//! replay reads where its capture read them. Uploading into them directly spares a replay a
//! fresh buffer and a device copy into the graph's for each input.

use crate::error::bad_input;
use candle_core::{Result, Tensor, WithDType};

/// Writes `values` (u32 or f32) into `dst`, which must be contiguous and hold as many elements
/// of their type. On a GPU it is one copy from the host into `dst`'s memory, ordered on the
/// device's stream after the work issued before it: a replay issued after it reads the new
/// values.
pub fn upload_into<T: WithDType>(dst: &Tensor, values: &[T]) -> Result<()> {
    check(dst, values)?;
    #[cfg(feature = "cuda")]
    if dst.device().is_cuda() {
        return crate::cuda::upload_into(dst, values);
    }
    let src = Tensor::from_slice(values, dst.shape(), dst.device())?;
    match dst.rank() {
        0 => Err(bad_input("upload_into", "a scalar")),
        _ => dst.slice_set(&src, 0, 0),
    }
}

fn check<T: WithDType>(dst: &Tensor, values: &[T]) -> Result<()> {
    if dst.dtype() != T::DTYPE || dst.elem_count() != values.len() || !dst.is_contiguous() {
        return Err(bad_input(
            "upload_into",
            format!(
                "{} {:?} values into a {:?} tensor of {:?}{}",
                values.len(),
                T::DTYPE,
                dst.dtype(),
                dst.dims(),
                if dst.is_contiguous() { "" } else { ", not contiguous" }
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn values_land_in_the_tensor_and_a_mismatch_is_refused() {
        let dst = Tensor::zeros((2, 3), candle_core::DType::U32, &Device::Cpu).unwrap();
        let view = dst.narrow(0, 1, 1).unwrap();
        upload_into(&view, &[7u32, 8, 9]).unwrap();
        assert_eq!(dst.to_vec2::<u32>().unwrap(), [[0, 0, 0], [7, 8, 9]]);
        assert!(upload_into(&dst, &[1u32, 2]).is_err(), "too few values");
        assert!(upload_into(&dst, &[1f32; 6]).is_err(), "another dtype");
        assert!(upload_into(&dst.t().unwrap(), &[1u32; 6]).is_err(), "strided");
    }
}

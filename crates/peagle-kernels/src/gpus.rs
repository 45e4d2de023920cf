//! How many GPUs this process can use: what `--device auto` chooses by.

/// The GPUs the CUDA driver reports: none in a build without the `cuda` feature, nor where the
/// driver finds none. An error, its message the driver's, where the driver cannot say: one too
/// old for the build, or broken.
pub fn cuda_devices() -> Result<usize, String> {
    #[cfg(feature = "cuda")]
    {
        use candle_core::cuda_backend::cudarc::driver::{sys::CUresult, CudaContext};
        match CudaContext::device_count() {
            Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
            Err(e) if e.0 == CUresult::CUDA_ERROR_NO_DEVICE => Ok(0),
            Err(e) => Err(e.to_string()),
        }
    }
    #[cfg(not(feature = "cuda"))]
    Ok(0)
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    #[test]
    fn a_build_without_cuda_sees_no_gpu() {
        assert_eq!(super::cuda_devices(), Ok(0));
    }
}

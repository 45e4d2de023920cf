//! How many GPUs this process can use (what `--device auto` chooses by), and how one is opened.

use candle_core::Device;

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

/// GPU `ordinal`, opened as every peagle process uses one.
///
/// - **One stream.** All of the device's work goes to one stream of its own, whichever thread
///   issues it. candle's `Device::new_cuda` issues to CUDA's per-thread default stream, one
///   stream for each host thread, unordered between threads; but an engine step runs on
///   whichever of rayon's threads takes it, and may leave kernels running for the next step to
///   read (the drafter's, say), or buffers for it to free and reallocate.
/// - **No events.** cudarc orders a buffer's uses across streams by two CUDA events it creates
///   with the buffer and destroys with it. With one stream nothing needs them, and they are
///   four driver calls for each of the hundred or so buffers a decode step allocates.
/// - **Freed memory kept** by the device's pool (`keep_freed_memory`), so that each step's
///   activations come from what the last step freed, not from the driver.
pub fn open_cuda(ordinal: usize) -> candle_core::Result<Device> {
    let device = Device::new_cuda_with_stream(ordinal)?;
    #[cfg(feature = "cuda")]
    {
        let cuda = device.as_cuda_device()?;
        // SAFETY: every buffer of this device is used on its one stream, in the order its work
        // is issued, which is all the events would enforce.
        unsafe { cuda.disable_event_tracking() };
        crate::cuda::keep_freed_memory(cuda)?;
    }
    Ok(device)
}

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    #[test]
    fn a_build_without_cuda_sees_no_gpu() {
        assert_eq!(super::cuda_devices(), Ok(0));
    }

    #[test]
    fn a_build_without_cuda_opens_no_gpu() {
        let error = super::open_cuda(0).unwrap_err().to_string();
        assert!(error.contains("cuda"), "{error}");
    }
}

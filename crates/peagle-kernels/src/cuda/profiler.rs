//! `cuda_profiler_range` on a CUDA device.

use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::Result;

/// `cuda_profiler_range`: the driver's profiler calls act on the thread's bound context.
pub(crate) fn profiler_range(device: &CudaDevice, on: bool) -> Result<()> {
    let stream = device.cuda_stream();
    stream.context().bind_to_thread().w()?;
    stream.synchronize().w()?;
    // SAFETY: the device's context is bound to this thread.
    let status = unsafe {
        if on {
            sys::cuProfilerStart()
        } else {
            sys::cuProfilerStop()
        }
    };
    status.result().w()
}

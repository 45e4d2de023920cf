//! What a GPU's memory holds, for sizing the KV cache from what is left (vLLM's
//! `--gpu-memory-utilization`): the driver's free and total bytes, and the peak of the
//! allocations a piece of work makes. On the CPU there is no such budget: both say None.

use candle_core::{Device, Result};

/// A device's memory as its driver reports it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    pub free: usize,
    pub total: usize,
}

/// The memory of `device`; None on the CPU.
pub fn device_memory(device: &Device) -> Result<Option<DeviceMemory>> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => crate::cuda::device_memory(cuda).map(Some),
        _ => Ok(None),
    }
}

/// Runs `f`, and says how far its allocations on `device` rose at their peak above what was
/// allocated when it began: candle allocates in stream order from the device's default pool,
/// whose high-water mark this reads. None on the CPU.
pub fn peak_allocated<T>(device: &Device, f: impl FnOnce() -> Result<T>) -> Result<(T, Option<usize>)> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => crate::cuda::peak_allocated(cuda, f).map(|(out, peak)| (out, Some(peak))),
        _ => Ok((f()?, None)),
    }
}

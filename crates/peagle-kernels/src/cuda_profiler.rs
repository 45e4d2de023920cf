//! The CUDA profiler API's capture range (cuProfilerStart to cuProfilerStop): work inside it
//! is what `ncu --profile-from-start off` and `nsys profile --capture-range=cudaProfilerApi`
//! record, so a run can leave its loading and warm-up out of a profile.

use crate::error::bad_input;
use candle_core::{Device, Result};

/// Opens (`on`) or closes the capture range on `device`'s context. A CPU has no such range.
pub fn cuda_profiler_range(device: &Device, on: bool) -> Result<()> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => crate::cuda::profiler_range(cuda, on),
        _ => Err(bad_input(
            "cuda_profiler_range",
            format!(
                "the CUDA profiler's capture range cannot {} without a CUDA device",
                if on { "open" } else { "close" }
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_has_no_capture_range() {
        let err = cuda_profiler_range(&Device::Cpu, true).unwrap_err();
        assert!(err.to_string().contains("cannot open without a CUDA device"), "{err}");
    }
}

//! The counters by which the last of the blocks that share a row's parts in
//! `kernels/paged_attention.cu` knows to fold them, one set a device, and the blocks of the
//! kernel a device holds at once (`attention_blocks`).

use crate::attention_blocks::{Cover, SPLIT_MIN};
use crate::attention_metadata::AttentionMetadata;
use crate::kernel_constants::ATTN_BLOCKS_PER_SM;
use crate::paged_attention::AttentionParams;
use candle_core::cuda_backend::cudarc::driver::sys::{CUdevice_attribute, CUstreamCaptureStatus};
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::cuda_backend::{CudaDevice, DeviceId, WrapErr};
use candle_core::Result;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The kernel's blocks an SM holds at once (its launch bounds' minimum).
const BLOCKS_PER_SM: usize = ATTN_BLOCKS_PER_SM;

/// Counters for (row, head) pairs, enough for any launch that shares parts: one shares them
/// only while its serving blocks are fewer than the blocks the GPU holds at once, and a block
/// serves at most 4 rows.
const COUNTERS: usize = 1 << 16;

/// Every device's counters, all zero between launches (the kernel leaves them so), made on its
/// first launch that shares parts and kept for the process: a captured CUDA graph holds their
/// address.
fn all_counters() -> MutexGuard<'static, HashMap<DeviceId, CudaSlice<u32>>> {
    static ALL: OnceLock<Mutex<HashMap<DeviceId, CudaSlice<u32>>>> = OnceLock::new();
    let all = ALL.get_or_init(Default::default);
    all.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The blocks of the kernel `device` holds at once: its SMs, each holding the launch bounds'
/// minimum.
pub(super) fn resident_blocks(device: &CudaDevice) -> Result<usize> {
    let sms = device
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .w()?;
    Ok(sms.max(1) as usize * BLOCKS_PER_SM)
}

/// Calls `f` with the blocks each row's parts get in this launch, covered as `cover` says (1
/// where they get one, or where they would need counters that cannot be made now) and, where
/// more than one, the device's counters.
pub(super) fn with_split<R>(
    device: &CudaDevice,
    meta: &AttentionMetadata,
    params: &AttentionParams,
    cover: &Cover,
    f: impl FnOnce(usize, Option<&mut CudaSlice<u32>>) -> Result<R>,
) -> Result<R> {
    // A window of SPLIT_MIN positions or fewer is always one part.
    let one_part = params.sliding_window.is_some_and(|w| w <= SPLIT_MIN);
    if cover.split == 1 || one_part || meta.num_rows() * params.num_heads > COUNTERS {
        return f(1, None);
    }
    let mut all = all_counters();
    let mine = match all.entry(device.id()) {
        Entry::Occupied(made) => made.into_mut(),
        Entry::Vacant(entry) => {
            let stream = device.cuda_stream();
            // Made during a capture, they would be the graph's: wait for a launch outside one.
            if stream.capture_status().w()? != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                return f(1, None);
            }
            entry.insert(stream.alloc_zeros::<u32>(COUNTERS).w()?)
        }
    };
    f(cover.split, Some(mine))
}

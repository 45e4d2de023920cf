//! The counters by which the last of the blocks that share a row's parts in
//! `kernels/paged_attention.cu` knows to fold them, one set a device, and the blocks each row's
//! parts get in a launch (`attention_blocks`).

use crate::attention_blocks::{blocks_each, Cover};
use crate::attention_metadata::AttentionMetadata;
use crate::kernel_constants::{ATTN_BLOCKS_PER_SM, ATTN_SPLIT_MIN};
use crate::paged_attention::AttentionParams;
use candle_core::cuda_backend::cudarc::driver::sys::{CUdevice_attribute, CUstreamCaptureStatus};
use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::cuda_backend::{CudaDevice, DeviceId, WrapErr};
use candle_core::Result;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The fewest positions a part of a row's keys holds.
const SPLIT_MIN: usize = ATTN_SPLIT_MIN;

/// The kernel's blocks an SM holds at once (its launch bounds' minimum).
const BLOCKS_PER_SM: usize = ATTN_BLOCKS_PER_SM;

/// Counters for (row, head) pairs, enough for any launch that shares parts: one shares them
/// only while its serving blocks are fewer than the blocks the GPU holds at once, and a block
/// serves at most 4 rows.
const COUNTERS: usize = 1 << 16;

/// A device's counters, all zero between launches (the kernel leaves them so), and its SMs.
struct SplitCounters {
    counters: CudaSlice<u32>,
    sms: usize,
}

/// Every device's counters, made on its first launch that may share parts and kept for the
/// process: a captured CUDA graph holds their address.
fn all_counters() -> MutexGuard<'static, HashMap<DeviceId, SplitCounters>> {
    static ALL: OnceLock<Mutex<HashMap<DeviceId, SplitCounters>>> = OnceLock::new();
    let all = ALL.get_or_init(Default::default);
    all.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Calls `f` with the blocks each row's parts get in this launch, covered as `cover` says (1 or
/// more; 1 where one block a row is asked for) and, where more than one, the device's counters.
pub(super) fn with_split<R>(
    device: &CudaDevice,
    meta: &AttentionMetadata,
    params: &AttentionParams,
    cover: &Cover,
    f: impl FnOnce(usize, Option<&mut CudaSlice<u32>>) -> Result<R>,
) -> Result<R> {
    let (num_heads, window) = (params.num_heads, params.sliding_window);
    // A window of SPLIT_MIN positions or fewer is always one part.
    if cover.one_a_row || window.is_some_and(|w| w <= SPLIT_MIN) || meta.num_rows() * num_heads > COUNTERS {
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
            let sms = stream
                .context()
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .w()?;
            entry.insert(SplitCounters {
                counters: stream.alloc_zeros::<u32>(COUNTERS).w()?,
                sms: sms.max(1) as usize,
            })
        }
    };
    match blocks_each(mine.sms * BLOCKS_PER_SM, cover.serving, num_heads / cover.head_group) {
        1 => f(1, None),
        blocks => f(blocks, Some(&mut mine.counters)),
    }
}

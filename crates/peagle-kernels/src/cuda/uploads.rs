//! Host values the kernels read, copied to the device once and reused while the same values
//! come again. A step's attention metadata and cache slots are the same for every layer of a
//! forward, and a layer's sinks for every step; without this each layer would copy them from
//! pageable host memory, one small transfer per kernel.
//!
//! Reuse is decided by the values themselves, so a caller may change its host copy at any
//! time. A replaced device copy is freed in stream order, after the kernels that read it.

use candle_core::cuda_backend::cudarc::driver::CudaSlice;
use candle_core::cuda_backend::{CudaDevice, DeviceId};
use candle_core::Result;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What a device copy holds: the latest of a kind replaces the one before, except sinks, one a
/// layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Upload {
    AttentionMetadata,
    CacheSlots,
    Sinks,
}

/// The most sets of sinks kept per device: every layer of a few models.
const MAX_SINKS: usize = 1024;

type Entries = HashMap<(DeviceId, Upload), Vec<(Vec<u32>, Arc<CudaSlice<u32>>)>>;

static UPLOADS: Mutex<Option<Entries>> = Mutex::new(None);

/// The device copy of `values`, made now or reused from an earlier call with equal values.
pub(crate) fn uploaded(device: &CudaDevice, kind: Upload, values: &[u32]) -> Result<Arc<CudaSlice<u32>>> {
    let mut uploads = UPLOADS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let kept = uploads
        .get_or_insert_with(HashMap::new)
        .entry((device.id(), kind))
        .or_default();
    if let Some((_, slice)) = kept.iter().find(|(host, _)| host.as_slice() == values) {
        return Ok(slice.clone());
    }
    let slice = Arc::new(device.clone_htod(values)?);
    let room = if kind == Upload::Sinks { MAX_SINKS } else { 1 };
    if kept.len() >= room {
        kept.clear();
    }
    kept.push((values.to_vec(), slice.clone()));
    Ok(slice)
}

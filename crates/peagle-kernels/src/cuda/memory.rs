//! A GPU's free and total memory, and the high-water mark of its current memory pool, from
//! which candle's stream-ordered allocations come.

use crate::device_memory::DeviceMemory;
use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::Result;
use std::ffi::c_void;
use std::mem::MaybeUninit;

/// Read once the stream's work is done: synchronizing is also when the pool gives back to the
/// driver what it holds freed (its release threshold is 0), which then counts as free.
pub(crate) fn device_memory(device: &CudaDevice) -> Result<DeviceMemory> {
    let stream = device.cuda_stream();
    stream.synchronize().w()?;
    let (free, total) = stream.context().mem_get_info().w()?;
    Ok(DeviceMemory { free, total })
}

pub(crate) fn peak_allocated<T>(device: &CudaDevice, f: impl FnOnce() -> Result<T>) -> Result<(T, usize)> {
    let stream = device.cuda_stream();
    let context = stream.context();
    context.bind_to_thread().w()?;
    let mut pool = MaybeUninit::uninit();
    // SAFETY: the context is bound, and its device is the one asked about.
    unsafe { sys::cuDeviceGetMemPool(pool.as_mut_ptr(), context.cu_device()) }
        .result()
        .map_err(|e| {
            crate::error::bad_input(
                "peak_allocated",
                format!("this GPU has no memory pool to measure allocations by ({e})"),
            )
        })?;
    // SAFETY: written by the call above, which succeeded.
    let pool = unsafe { pool.assume_init() };
    let before = pool_attribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
    // Resetting the high-water mark sets it to what is allocated now.
    let mut zero = 0u64;
    // SAFETY: the attribute is a cuuint64_t, and 0 is the one value it may be set to.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            &mut zero as *mut u64 as *mut c_void,
        )
    }
    .result()
    .w()?;
    let out = f()?;
    stream.synchronize().w()?;
    let high = pool_attribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?;
    Ok((out, high.saturating_sub(before) as usize))
}

fn pool_attribute(pool: sys::CUmemoryPool, attribute: sys::CUmemPool_attribute) -> Result<u64> {
    let mut value = 0u64;
    // SAFETY: the attributes read here are cuuint64_t.
    unsafe { sys::cuMemPoolGetAttribute(pool, attribute, &mut value as *mut u64 as *mut c_void) }
        .result()
        .w()?;
    Ok(value)
}

//! A GPU's free and total memory, and the high-water mark of its current memory pool, from
//! which candle's stream-ordered allocations come; and that pool's keeping of what is freed.

use crate::device_memory::DeviceMemory;
use candle_core::cuda_backend::cudarc::driver::sys;
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::Result;
use std::ffi::c_void;
use std::mem::MaybeUninit;

/// Read once the stream's work is done and the pool holds nothing freed: what it kept for
/// reuse (`keep_freed_memory`) is given back to the driver first, so that it counts as free.
pub(crate) fn device_memory(device: &CudaDevice) -> Result<DeviceMemory> {
    let stream = device.cuda_stream();
    stream.synchronize().w()?;
    let pool = memory_pool(device, "device_memory")?;
    // SAFETY: the pool is the device's own, and every freed block in it is done with.
    unsafe { sys::cuMemPoolTrimTo(pool, 0) }.result().w()?;
    let (free, total) = stream.context().mem_get_info().w()?;
    Ok(DeviceMemory { free, total })
}

/// Makes the pool keep what is freed for the allocations after it. By default (a release
/// threshold of 0) it gives all of it back to the driver at every synchronization, which an
/// engine step ends with, and the next step's allocations then have the driver map memory
/// again. The pool then holds at most a step's activations, which the KV cache's budget
/// already leaves room for.
pub(crate) fn keep_freed_memory(device: &CudaDevice) -> Result<()> {
    let pool = memory_pool(device, "keep_freed_memory")?;
    set_pool_attribute(
        pool,
        sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        u64::MAX,
    )
}

/// The device's current memory pool, from which candle's stream-ordered allocations come; its
/// context bound to this thread.
fn memory_pool(device: &CudaDevice, op: &'static str) -> Result<sys::CUmemoryPool> {
    let context = device.cuda_stream().context().clone();
    context.bind_to_thread().w()?;
    let mut pool = MaybeUninit::uninit();
    // SAFETY: the context is bound, and its device is the one asked about.
    unsafe { sys::cuDeviceGetMemPool(pool.as_mut_ptr(), context.cu_device()) }
        .result()
        .map_err(|e| crate::error::bad_input(op, format!("this GPU has no memory pool ({e})")))?;
    // SAFETY: written by the call above, which succeeded.
    Ok(unsafe { pool.assume_init() })
}

pub(crate) fn peak_allocated<T>(device: &CudaDevice, f: impl FnOnce() -> Result<T>) -> Result<(T, usize)> {
    let stream = device.cuda_stream();
    let pool = memory_pool(device, "peak_allocated")?;
    let before = pool_attribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
    // Resetting the high-water mark (to 0, the one value it may be set to) sets it to what is
    // allocated now.
    set_pool_attribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)?;
    let out = f()?;
    stream.synchronize().w()?;
    let high = pool_attribute(pool, sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?;
    Ok((out, high.saturating_sub(before) as usize))
}

/// Sets one of the pool's cuuint64_t attributes: its release threshold or a high-water mark.
fn set_pool_attribute(pool: sys::CUmemoryPool, attribute: sys::CUmemPool_attribute, mut value: u64) -> Result<()> {
    // SAFETY: the attributes set here are cuuint64_t.
    unsafe { sys::cuMemPoolSetAttribute(pool, attribute, &mut value as *mut u64 as *mut c_void) }
        .result()
        .w()
}

fn pool_attribute(pool: sys::CUmemoryPool, attribute: sys::CUmemPool_attribute) -> Result<u64> {
    let mut value = 0u64;
    // SAFETY: the attributes read here are cuuint64_t.
    unsafe { sys::cuMemPoolGetAttribute(pool, attribute, &mut value as *mut u64 as *mut c_void) }
        .result()
        .w()?;
    Ok(value)
}

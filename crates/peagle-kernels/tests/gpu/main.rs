//! Every CUDA kernel against its CPU reference, the batch invariance of the GPU path, the
//! device as `open_cuda` opens it (one stream for every thread), and the accounting of the
//! memory the device's pool keeps.
//! Built with the `cuda` feature only and run by scripts/gpu_check.sh on a GPU host; without a
//! GPU each test says so and passes, so a CUDA build's tests can run anywhere.
#![cfg(feature = "cuda")]

#[path = "../common/mod.rs"]
mod common;
#[path = "../../examples/common/interleaved_batch.rs"]
mod interleaved_batch;

mod attention;
mod dense_experts;
mod experts;
mod experts_reference;
mod matmul;
mod row_ops;
mod sampling;

use candle_core::{DType, Device, Tensor};
use interleaved_batch::interleaved_batch;
use peagle_kernels::{device_memory, open_cuda};

fn gpu() -> Option<Device> {
    match open_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// With the pool keeping what is freed for later allocations (as `open_cuda` sets it), a freed
/// 256 MiB stays in the pool, and `device_memory` still counts it as free: the KV cache is
/// sized by it.
#[test]
fn memory_the_pool_keeps_counts_as_free() {
    let Some(dev) = gpu() else { return };
    let free = || device_memory(&dev).unwrap().unwrap().free;
    let before = free();
    drop(Tensor::zeros(256 << 20, DType::U8, &dev).unwrap());
    let after = free();
    assert!(
        before.abs_diff(after) < 32 << 20,
        "{before} bytes free before a freed allocation, {after} after"
    );
}

/// The device issues to a stream of its own, not CUDA's per-thread default stream (whose
/// handle is 2), and creates no events for its buffers.
#[test]
fn the_device_has_one_stream_and_no_events() {
    let Some(dev) = gpu() else { return };
    let cuda = dev.as_cuda_device().unwrap();
    let stream = cuda.cuda_stream().cu_stream() as usize;
    assert!(stream > 2, "the stream's handle is {stream}: a default stream");
    assert!(!cuda.is_event_tracking());
}

/// Work one thread issues is done before work another thread issues after it: a chain of
/// adds that takes the GPU far longer than the host takes to issue it, read back whole from
/// a second thread (on per-thread default streams the copy would run beside the adds).
#[test]
fn work_from_two_threads_runs_in_issue_order() {
    let Some(dev) = gpu() else { return };
    const ADDS: usize = 24;
    let mut x = Tensor::zeros(1 << 22, DType::F32, &dev).unwrap();
    for _ in 0..ADDS {
        x = (x + 1.0).unwrap();
    }
    let read = std::thread::scope(|s| s.spawn(|| x.to_vec1::<f32>().unwrap()).join().unwrap());
    let wrong = read.iter().filter(|&&v| v != ADDS as f32).count();
    assert_eq!(wrong, 0, "{wrong} of {} elements read before their adds", read.len());
}

/// Deterministic values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn tensor(shape: (usize, usize), seed: u64, scale: f32) -> Tensor {
    Tensor::from_vec(values(shape.0 * shape.1, seed, scale), shape, &Device::Cpu).unwrap()
}

/// The elements widened to f32 on the host (which converts FP8 on any GPU).
fn host(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    host(t).into_iter().map(f32::to_bits).collect()
}

fn max_rel_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0.0, f32::max)
}

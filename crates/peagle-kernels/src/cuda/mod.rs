//! CUDA forwards of the kernels. Each op's `cuda_fwd`, beside its CPU forward, calls a launcher
//! here: it checks what its kernel assumes, picks the kernel for the dtypes and launches it on
//! the device's stream. The kernels are `kernels/*.cu` at the repository's root, compiled to
//! PTX by build.rs; `module` loads them.

mod argmax;
mod gather;
mod kv_write;
mod linear;
mod memory;
mod module;
mod moe;
mod moe_dense;
mod paged_attention;
mod profiler;
mod rms_norm;
mod rope;
mod sampling;
mod split_counters;
mod swiglu;
mod token_mask;

pub(crate) use argmax::argmax_rows;
pub(crate) use gather::{chain_drafts, gather_rows, take_ids, uninitialized_u32, ChainTensors};
pub(crate) use kv_write::{kv_write, NewRows};
pub(crate) use linear::linear;
pub(crate) use memory::{device_memory, keep_freed_memory, peak_allocated};
pub(crate) use moe::{
    lay_out_experts, moe_combine, moe_experts, with_expert_views, ExpertWeights, Mxfp4Buffers, MAX_EXPERTS,
};
pub(crate) use paged_attention::{paged_attention, AttentionInputs};
pub(crate) use profiler::profiler_range;
pub(crate) use rms_norm::{experts_add_rms_norm, rms_norm, rms_norm_pair};
pub(crate) use rope::rope;
pub(crate) use sampling::{gumbel_sample, row_candidates};
pub(crate) use swiglu::swiglu;
pub(crate) use token_mask::mask_tokens;

use crate::error::bad_input;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage};
use candle_core::{DType, Layout, Result, Shape, Storage, Tensor};

/// Fails unless `layout`'s first element starts on a 16-byte boundary, as kernels that read
/// rows by vector loads need.
fn aligned_16(op: &'static str, what: &str, layout: &Layout, dtype: DType) -> Result<()> {
    if !starts_aligned_16(layout, dtype) {
        return Err(bad_input(op, format!("{what} does not start on a 16-byte boundary")));
    }
    Ok(())
}

/// Whether `layout`'s first element starts on a 16-byte boundary (the buffers under it do).
fn starts_aligned_16(layout: &Layout, dtype: DType) -> bool {
    (layout.start_offset() * dtype.size_in_bytes()).is_multiple_of(16)
}

/// The elements of a contiguous layout over `storage`, as a view the kernel reads.
fn view<'a, T: CudaDType>(storage: &'a CudaStorage, layout: &Layout, what: &str) -> Result<CudaView<'a, T>> {
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| bad_input("peagle kernel", format!("{what} must be contiguous")))?;
    Ok(storage.as_cuda_slice::<T>()?.slice(start..end))
}

/// The rows of a [rows, width] layout over `storage` whose rows may be strided
/// (`contiguous::strided_rows`), as a view from its first row to the end of its last, and the
/// rows' stride in elements, which the kernel takes.
fn strided_view<'a, T: CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
    op: &'static str,
    what: &str,
) -> Result<(CudaView<'a, T>, i32)> {
    let rows = crate::contiguous::strided_rows(layout, op, what)?;
    let end = match layout.shape().dims2()?.0 {
        0 => rows.start,
        n => rows.start + (n - 1) * rows.stride + rows.width,
    };
    Ok((
        storage.as_cuda_slice::<T>()?.slice(rows.start..end),
        int(op, rows.stride)?,
    ))
}

/// Calls `f` with a view of `tensor`'s elements on the device: a tensor the kernel reads beside
/// the op's own inputs, whose storage stays locked while `f` runs.
fn with_view<T: CudaDType, R>(tensor: &Tensor, what: &str, f: impl FnOnce(CudaView<'_, T>) -> Result<R>) -> Result<R> {
    let (storage, layout) = tensor.storage_and_layout();
    match &*storage {
        Storage::Cuda(s) => f(view::<T>(s, layout, what)?),
        _ => Err(bad_input("peagle kernel", format!("{what} must be on the GPU"))),
    }
}

/// `with_view` over several tensors of one element type at once.
fn with_views<T: CudaDType, R, const N: usize>(
    tensors: [(&Tensor, &str); N],
    f: impl FnOnce([CudaView<'_, T>; N]) -> Result<R>,
) -> Result<R> {
    let locked = tensors.map(|(tensor, what)| (tensor.storage_and_layout(), what));
    let mut views = Vec::with_capacity(N);
    for ((storage, layout), what) in &locked {
        match &**storage {
            Storage::Cuda(s) => views.push(view::<T>(s, layout, what)?),
            _ => return Err(bad_input("peagle kernel", format!("{what} must be on the GPU"))),
        }
    }
    match <[CudaView<'_, T>; N]>::try_from(views) {
        Ok(views) => f(views),
        Err(_) => unreachable!("one view a tensor"),
    }
}

/// `with_view` where there is a tensor, else `f` with none: an input a kernel reads where its
/// pointer is not null.
fn with_optional_view<T: CudaDType, R>(
    tensor: Option<&Tensor>,
    what: &str,
    f: impl FnOnce(Option<CudaView<'_, T>>) -> Result<R>,
) -> Result<R> {
    match tensor {
        Some(t) => with_view(t, what, |view| f(Some(view))),
        None => f(None),
    }
}

/// The device pointer a kernel reads as an absent operand.
static NULL_POINTER: u64 = 0;

/// Pushes `arg` onto a launch's arguments, or a null device pointer where there is none: the
/// kernels take an optional operand as a pointer that may be null.
fn arg_or_null<'a, A>(builder: &mut LaunchArgs<'a>, arg: Option<A>)
where
    LaunchArgs<'a>: PushKernelArg<A>,
{
    match arg {
        Some(arg) => builder.arg(arg),
        None => <LaunchArgs<'a> as PushKernelArg<&'static u64>>::arg(builder, &NULL_POINTER),
    };
}

/// A tensor of `shape` over a buffer a kernel wrote, for a launcher that is no candle op.
fn tensor<T: CudaDType + DeviceRepr>(slice: CudaSlice<T>, device: &CudaDevice, shape: impl Into<Shape>) -> Tensor {
    let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, device.clone()));
    Tensor::from_storage(storage, shape, candle_core::op::BackpropOp::none(), false)
}

/// A fresh device buffer of `len` elements that the kernel writes in full.
fn output<T: DeviceRepr>(device: &CudaDevice, len: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every launcher's kernel writes each element of its output before it is read.
    unsafe { device.alloc::<T>(len) }
}

/// `len` zero words on the device of `like`: the output of an op with nothing to compute.
pub(crate) fn zeros(like: &CudaStorage, len: usize) -> Result<CudaStorage> {
    let device = &like.device;
    Ok(CudaStorage::wrap_cuda_slice(
        device.alloc_zeros::<u32>(len)?,
        device.clone(),
    ))
}

/// The kernels' name for an element type: `f32` or `bf16`.
fn dtype_name(op: &'static str, dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        other => Err(bad_input(
            op,
            format!("{other:?} on CUDA: the kernels take f32 or bf16"),
        )),
    }
}

/// The kernels' name for a type that may also be FP8 (a KV cache's, a weight's): `f32`,
/// `bf16` or `f8e4m3`.
fn dtype_name_or_fp8(op: &'static str, dtype: DType) -> Result<&'static str> {
    match dtype {
        DType::F8E4M3 => Ok("f8e4m3"),
        other => dtype_name(op, other),
    }
}

/// Calls `$f::<A, C>(args..)` with the element types of a row dtype (f32 or bf16) and one
/// that may also be FP8 (a KV cache's, a weight's: f32, bf16 or f8e4m3).
macro_rules! by_dtypes_or_fp8 {
    ($op:expr, ($a:expr, $c:expr), $f:ident($($arg:expr),* $(,)?)) => {
        match ($a, $c) {
            (DType::F32, DType::F8E4M3) => $f::<f32, float8::F8E4M3>($($arg),*),
            (DType::BF16, DType::F8E4M3) => $f::<half::bf16, float8::F8E4M3>($($arg),*),
            (a, c) => crate::cuda::by_dtypes!($op, (a, c), $f($($arg),*)),
        }
    };
}
pub(crate) use by_dtypes_or_fp8;

/// Calls `$f::<A, B>(args..)` with the element types of two dtypes, each f32 or bf16.
macro_rules! by_dtypes {
    ($op:expr, ($a:expr, $b:expr), $f:ident($($arg:expr),* $(,)?)) => {
        match ($a, $b) {
            (DType::F32, DType::F32) => $f::<f32, f32>($($arg),*),
            (DType::F32, DType::BF16) => $f::<f32, half::bf16>($($arg),*),
            (DType::BF16, DType::F32) => $f::<half::bf16, f32>($($arg),*),
            (DType::BF16, DType::BF16) => $f::<half::bf16, half::bf16>($($arg),*),
            (a, b) => Err(bad_input($op, format!("{a:?} with {b:?} on CUDA: the kernels take f32 or bf16"))),
        }
    };
}
pub(crate) use by_dtypes;

/// Calls `$f::<T>(args..)` with the element type of a dtype, f32 or bf16.
macro_rules! by_dtype {
    ($op:expr, $a:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $a {
            DType::F32 => $f::<f32>($($arg),*),
            DType::BF16 => $f::<half::bf16>($($arg),*),
            a => Err(bad_input($op, format!("{a:?} on CUDA: the kernels take f32 or bf16"))),
        }
    };
}
pub(crate) use by_dtype;

/// One block of `threads` per grid point.
fn grid(grid_dim: (u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid_dim.0, grid_dim.1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The most blocks a launch's second grid dimension holds.
const MAX_GRID_Y: usize = 65535;

/// The blocks that deal one row of `elements` to `threads` threads each, for an elementwise
/// kernel's grid.y: enough for one element a thread, within the grid's limit (the kernels loop
/// over the rest).
fn row_blocks(elements: usize, threads: usize) -> u32 {
    elements.div_ceil(threads).clamp(1, MAX_GRID_Y) as u32
}

/// A size as the kernels' `int`, or an error: the kernels index with 32-bit integers.
fn int(op: &'static str, n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| bad_input(op, format!("{n} does not fit the kernel's 32-bit sizes")))
}

/// Writes `values` into `dst`'s memory on its device (contiguous, of the values' dtype, u32 or
/// f32, as many elements: checked by the caller), ordered on the device's stream.
pub(crate) fn upload_into<T>(dst: &Tensor, values: &[T]) -> Result<()> {
    let (storage, layout) = dst.storage_and_layout();
    let Storage::Cuda(s) = &*storage else {
        return Err(bad_input("upload_into", "the tensor must be on the GPU"));
    };
    match dst.dtype() {
        DType::U32 => copy_into(&view::<u32>(s, layout, "dst")?, &s.device, values),
        DType::F32 => copy_into(&view::<f32>(s, layout, "dst")?, &s.device, values),
        other => Err(bad_input("upload_into", format!("{other:?}: u32 or f32"))),
    }
}

/// Copies `values` from the host into `target`, which holds as many elements of their size.
fn copy_into<U, T>(target: &CudaView<'_, U>, device: &CudaDevice, values: &[T]) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::{result, DevicePtr};
    use candle_core::cuda_backend::WrapErr;
    let stream = device.cuda_stream();
    stream.context().bind_to_thread().w()?;
    let (ptr, _recorded) = target.device_ptr(&stream);
    // SAFETY: `target` holds `values.len()` elements of T's size, and the copy is ordered on
    // the stream every kernel of candle's and peagle's runs on. The driver has read `values`
    // when the call returns, as with candle's own uploads.
    unsafe { result::memcpy_htod_async(ptr, values, stream.cu_stream()) }.w()
}

use super::module::{function, Kernel, Module};
use super::{by_dtypes_or_fp8, dtype_name, dtype_name_or_fp8, grid, int, strided_view, with_view};
use crate::error::bad_input;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Tensor};

/// `kernels/kv_write.cu`: row t of `src` [tokens, width], rows possibly strided, divided by
/// `scale`, into row `slots[t]` of `cache` (shapes and slots already checked).
pub(crate) fn kv_write(
    cache: &mut CudaStorage,
    cache_l: &Layout,
    src: &CudaStorage,
    src_l: &Layout,
    slots: &Tensor,
    width: usize,
    scale: f32,
) -> Result<()> {
    let tokens = src_l.shape().dims2()?.0;
    // The slots checked are the host's; the kernel reads these, one per row.
    if slots.dims1()? != tokens {
        return Err(bad_input(
            "write_kv",
            format!("{} device slots for {tokens} rows", slots.dims1()?),
        ));
    }
    if tokens == 0 {
        return Ok(());
    }
    let device = cache.device.clone();
    let name = format!(
        "kv_write_{}_{}",
        dtype_name("write_kv", src.dtype())?,
        dtype_name_or_fp8("write_kv", cache.dtype())?
    );
    let func = function(&device, Module::KvWrite, &name)?;
    let (start, _) = cache_l
        .contiguous_offsets()
        .ok_or_else(|| bad_input("write_kv", "cache must be contiguous"))?;
    with_view::<u32, _>(slots, "cache slots", |slots| {
        let args = Args {
            func: &func,
            src,
            src_l,
            tokens: int("write_kv", tokens)? as u32,
            slots: &slots,
            width: int("write_kv", width)?,
            scale,
        };
        by_dtypes_or_fp8!("write_kv", (src.dtype(), cache.dtype()), launch(cache, start, &args))
    })
}

struct Args<'a> {
    func: &'a Kernel,
    src: &'a CudaStorage,
    src_l: &'a Layout,
    slots: &'a CudaView<'a, u32>,
    tokens: u32,
    width: i32,
    scale: f32,
}

fn launch<S: CudaDType, C: CudaDType>(cache: &mut CudaStorage, start: usize, a: &Args) -> Result<()> {
    let (src, stride) = strided_view::<S>(a.src, a.src_l, "write_kv", "the new rows")?;
    let mut cache = cache.as_cuda_slice_mut::<C>()?.slice_mut(start..);
    let mut builder = a.func.builder();
    builder
        .arg(&mut cache)
        .arg(&src)
        .arg(a.slots)
        .arg(&a.width)
        .arg(&stride)
        .arg(&a.scale);
    // SAFETY: the slots were checked against the cache's rows, the rows against `width`; the
    // view spans the source's rows, `stride` apart.
    unsafe { builder.launch(grid((a.tokens, 1), 256)) }.w()?;
    Ok(())
}

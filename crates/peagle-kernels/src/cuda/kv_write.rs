use super::module::{function, Kernel, Module};
use super::{
    arg_or_null, by_dtypes_or_fp8, dtype_name, dtype_name_or_fp8, grid, int, strided_view, with_optional_view,
    with_view,
};
use crate::error::bad_input;
use crate::paged_attention::KvScale;
use crate::rope::Rotation;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Tensor};

/// A batch's new keys and values, [tokens, width] each, their rows possibly strided, and the
/// cache's scales they are divided by.
pub(crate) struct NewRows<'a> {
    pub k: (&'a CudaStorage, &'a Layout),
    pub v: (&'a CudaStorage, &'a Layout),
    pub scale: KvScale,
    /// The keys' rotation, its tables checked, where the kernel rotates them.
    pub rotation: Option<Rotation<'a>>,
}

/// `kernels/kv_write.cu`: row t of the keys and of the values into row `slots[t]` of
/// `cache`'s two halves [2, num_slots, width] (shapes and slots already checked), in one launch.
pub(crate) fn kv_write(
    cache: &mut CudaStorage,
    cache_l: &Layout,
    new: &NewRows,
    slots: &Tensor,
    num_slots: usize,
    width: usize,
) -> Result<()> {
    let tokens = new.k.1.shape().dims2()?.0;
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
    let src_dtype = new.k.0.dtype();
    let name = format!(
        "kv_write_{}_{}",
        dtype_name("write_kv", src_dtype)?,
        dtype_name_or_fp8("write_kv", cache.dtype())?
    );
    let func = function(&device, Module::KvWrite, &name)?;
    let (start, _) = cache_l
        .contiguous_offsets()
        .ok_or_else(|| bad_input("write_kv", "cache must be contiguous"))?;
    let tables = new.rotation.map(|r| r.tables);
    let table_rows = new.rotation.and_then(|r| r.table_rows);
    let head_dim = int("write_kv", new.rotation.map_or(0, |r| r.head_dim))?;
    let table_len = int("write_kv", tables.map_or(Ok(0), |t| t.dim(1))?)?;
    with_view::<u32, _>(slots, "cache slots", |slots| {
        with_optional_view::<f32, _>(tables, "rotary tables", |tables| {
            with_optional_view::<u32, _>(table_rows, "rotary table rows", |table_rows| {
                let args = Args {
                    func: &func,
                    new,
                    tokens: int("write_kv", tokens)? as u32,
                    slots: &slots,
                    tables: tables.as_ref(),
                    table_rows: table_rows.as_ref(),
                    table_len,
                    num_slots: int("write_kv", num_slots)?,
                    width: int("write_kv", width)?,
                    head_dim,
                };
                by_dtypes_or_fp8!("write_kv", (src_dtype, cache.dtype()), launch(cache, start, &args))
            })
        })
    })
}

struct Args<'a> {
    func: &'a Kernel,
    new: &'a NewRows<'a>,
    slots: &'a CudaView<'a, u32>,
    /// The keys' rotary tables; none: the keys as they are.
    tables: Option<&'a CudaView<'a, f32>>,
    /// The table row of each row; none: its own.
    table_rows: Option<&'a CudaView<'a, u32>>,
    /// The tables' rows.
    table_len: i32,
    tokens: u32,
    num_slots: i32,
    width: i32,
    head_dim: i32,
}

fn launch<S: CudaDType, C: CudaDType>(cache: &mut CudaStorage, start: usize, a: &Args) -> Result<()> {
    let (k, k_stride) = strided_view::<S>(a.new.k.0, a.new.k.1, "write_kv", "the keys")?;
    let (v, v_stride) = strided_view::<S>(a.new.v.0, a.new.v.1, "write_kv", "the values")?;
    let mut cache = cache.as_cuda_slice_mut::<C>()?.slice_mut(start..);
    let mut builder = a.func.builder();
    builder.arg(&mut cache).arg(&k).arg(&v).arg(a.slots);
    arg_or_null(&mut builder, a.tables);
    arg_or_null(&mut builder, a.table_rows);
    builder
        .arg(&a.table_len)
        .arg(&a.num_slots)
        .arg(&a.width)
        .arg(&k_stride)
        .arg(&v_stride)
        .arg(&a.head_dim)
        .arg(&a.new.scale.k)
        .arg(&a.new.scale.v);
    // SAFETY: the slots were checked against the cache's slots, the rows against `width`, the
    // cache against [2, num_slots, width], the tables against [2, n, head_dim / 2] (n = tokens
    // without table rows; with them, one a token, each read as at most n - 1 by the kernel);
    // the views span the sources' rows, their strides apart.
    unsafe { builder.launch(grid((a.tokens, 2), 256)) }.w()?;
    Ok(())
}

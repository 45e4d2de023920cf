use super::module::{function, Kernel, Module};
use super::{
    arg_or_null, by_dtypes, dtype_name, grid, int, output, starts_aligned_16, tensor, view, with_expert_views,
};
use crate::error::bad_input;
use crate::experts::ExpertOutputs;
use crate::kernel_constants::RMS_THREADS;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape, Storage, Tensor};

/// Threads a block, one block a row.
const RMS_BLOCK: u32 = RMS_THREADS as u32;

/// `kernels/rms_norm.cu` over `x` [rows, width] (shapes already checked). With a residual the
/// result is [2, rows, width]: the normed rows, then the sums `x + residual`.
pub(crate) fn rms_norm(
    x: (&CudaStorage, &Layout),
    residual: Option<(&CudaStorage, &Layout)>,
    weight: (&CudaStorage, &Layout),
    eps: f32,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "rms_norm";
    let (rows, width) = x.1.shape().dims2()?;
    let (dtype, w_dtype) = (x.0.dtype(), weight.0.dtype());
    let aligned = [Some(x), residual, Some(weight)]
        .into_iter()
        .flatten()
        .all(|(s, l)| starts_aligned_16(l, s.dtype()));
    let args = Args::new(OP, &x.0.device, (dtype, w_dtype), (rows, width), eps, aligned)?;
    let out = by_dtypes!(OP, (dtype, w_dtype), launch(x, residual, weight, &args))?;
    let shape = match residual {
        Some(_) => Shape::from((2, rows, width)),
        None => Shape::from((rows, width)),
    };
    Ok((out, shape))
}

struct Args {
    func: Kernel,
    rows: usize,
    width: i32,
    eps: f32,
    vector: i32,
}

impl Args {
    /// The launch of kernel `{op}_{rows' dtype}_{weight's dtype}` over `rows` of `width`, whole
    /// vectors of 8 by one load each where every operand starts `aligned` (16 bytes) and the
    /// width allows it. f32 rows with a bf16 weight are refused.
    fn new(
        op: &'static str,
        device: &CudaDevice,
        (dtype, w_dtype): (DType, DType),
        (rows, width): (usize, usize),
        eps: f32,
        aligned: bool,
    ) -> Result<Self> {
        if (dtype, w_dtype) == (DType::F32, DType::BF16) {
            return Err(bad_input(op, "f32 rows with a bf16 weight: cast the weight to f32"));
        }
        let name = format!("{op}_{}_{}", dtype_name(op, dtype)?, dtype_name(op, w_dtype)?);
        Ok(Self {
            func: function(device, Module::RmsNorm, &name)?,
            rows,
            width: int(op, width)?,
            eps,
            vector: i32::from(width.is_multiple_of(8) && aligned),
        })
    }
}

fn launch<T: CudaDType + DeviceRepr, W: CudaDType>(
    x: (&CudaStorage, &Layout),
    residual: Option<(&CudaStorage, &Layout)>,
    weight: (&CudaStorage, &Layout),
    a: &Args,
) -> Result<CudaStorage> {
    let device = &x.0.device;
    let outputs = if residual.is_some() { 2 } else { 1 };
    let mut out = output::<T>(device, outputs * a.rows * a.width as usize)?;
    let xs = view::<T>(x.0, x.1, "x")?;
    let ws = view::<W>(weight.0, weight.1, "weight")?;
    let residual = residual.map(|(s, l)| view::<T>(s, l, "residual")).transpose()?;
    let mut builder = a.func.builder();
    builder.arg(&mut out).arg(&xs);
    arg_or_null(&mut builder, residual.as_ref());
    builder.arg(&ws).arg(&a.width).arg(&a.eps).arg(&a.vector);
    // SAFETY: x and the residual hold rows * width elements, the weight width, `out` one or
    // two times rows * width as the kernel writes; `vector` only where all start 16-byte
    // aligned and width is a multiple of 8.
    unsafe { builder.launch(grid((a.rows as u32, 1), RMS_BLOCK)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

/// `experts_add_rms_norm_*` (`kernels/rms_norm.cu`): `(sum, normed)` with `sum` = the experts'
/// outputs combined (`moe_combine`'s bits) plus `residual` [rows, width], in one launch.
pub(crate) fn experts_add_rms_norm(
    o: &ExpertOutputs,
    residual: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "experts_add_rms_norm";
    let width = o.y.dim(1)?;
    let (dtype, w_dtype) = (o.dtype, weight.dtype());
    if residual.dims() != [o.rows, width] || residual.dtype() != dtype || weight.dims() != [width] {
        return Err(bad_input(
            OP,
            format!(
                "a residual {:?} {:?} and weight {:?} for {} rows of {width} {dtype:?}",
                residual.dims(),
                residual.dtype(),
                weight.dims(),
                o.rows
            ),
        ));
    }
    let (rs, rl) = residual.storage_and_layout();
    let (ws, wl) = weight.storage_and_layout();
    let (Storage::Cuda(rs), Storage::Cuda(ws)) = (&*rs, &*ws) else {
        return Err(bad_input(OP, "the residual and the weight must be on the GPU"));
    };
    // The experts' outputs are read 8 a load too.
    let aligned =
        starts_aligned_16(rl, dtype) && starts_aligned_16(wl, w_dtype) && starts_aligned_16(o.y.layout(), DType::F32);
    let args = Args::new(OP, &rs.device, (dtype, w_dtype), (o.rows, width), eps, aligned)?;
    let both = by_dtypes!(OP, (dtype, w_dtype), launch_experts(o, (rs, rl), (ws, wl), &args))?;
    Ok((both.get(1)?, both.get(0)?))
}

fn launch_experts<T: CudaDType + DeviceRepr, W: CudaDType>(
    o: &ExpertOutputs,
    residual: (&CudaStorage, &Layout),
    weight: (&CudaStorage, &Layout),
    a: &Args,
) -> Result<Tensor> {
    let device = &residual.0.device;
    let mut out = output::<T>(device, 2 * a.rows * a.width as usize)?;
    let rs = view::<T>(residual.0, residual.1, "residual")?;
    let ws = view::<W>(weight.0, weight.1, "weight")?;
    let k = int("experts_add_rms_norm", o.top_k)?;
    with_expert_views(o, |[y, weights], pair_of| {
        let mut builder = a.func.builder();
        builder.arg(&mut out).arg(&y).arg(&weights).arg(&pair_of).arg(&k);
        builder.arg(&rs).arg(&ws).arg(&a.width).arg(&a.eps).arg(&a.vector);
        // SAFETY: `pair_of` maps each row's k pairs into `y` [pairs, width]; the residual
        // holds rows * width elements, the weight width, `out` twice rows * width; `vector`
        // only where the three start 16-byte aligned and width is a multiple of 8.
        unsafe { builder.launch(grid((a.rows as u32, 1), RMS_BLOCK)) }.w()?;
        Ok(())
    })?;
    Ok(tensor(out, device, (2, a.rows, a.width as usize)))
}

/// `rms_norm_pair_*` (`kernels/rms_norm.cu`): `a` normed by `wa` and `b` by `wb`, both
/// [rows, width] and contiguous, side by side in one [rows, 2 * width] tensor.
pub(crate) fn rms_norm_pair(a: &Tensor, wa: &Tensor, b: &Tensor, wb: &Tensor, eps: f32) -> Result<Tensor> {
    const OP: &str = "rms_norm_pair";
    let (rows, width) = a.dims2()?;
    let (dtype, w_dtype) = (a.dtype(), wa.dtype());
    if b.dims() != a.dims()
        || b.dtype() != dtype
        || wa.dims() != [width]
        || wb.dims() != [width]
        || wb.dtype() != w_dtype
    {
        return Err(bad_input(
            OP,
            format!(
                "rows {:?} {dtype:?} and {:?} {:?} with weights {:?} {w_dtype:?} and {:?} {:?}",
                a.dims(),
                b.dims(),
                b.dtype(),
                wa.dims(),
                wb.dims(),
                wb.dtype()
            ),
        ));
    }
    let parts = [a, wa, b, wb].map(Tensor::storage_and_layout);
    let [(as_, al), (was, wal), (bs, bl), (wbs, wbl)] = &parts;
    let (Storage::Cuda(as_), Storage::Cuda(was), Storage::Cuda(bs), Storage::Cuda(wbs)) =
        (&**as_, &**was, &**bs, &**wbs)
    else {
        return Err(bad_input(OP, "the rows and the weights must be on the GPU"));
    };
    let aligned = [(al, dtype), (bl, dtype), (wal, w_dtype), (wbl, w_dtype)]
        .iter()
        .all(|(l, d)| starts_aligned_16(l, *d));
    let args = Args::new(OP, &as_.device, (dtype, w_dtype), (rows, width), eps, aligned)?;
    if rows == 0 {
        return crate::no_rows(2 * width, dtype, a.device());
    }
    by_dtypes!(
        OP,
        (dtype, w_dtype),
        launch_pair([(as_, *al), (bs, *bl)], [(was, *wal), (wbs, *wbl)], &args)
    )
}

fn launch_pair<T: CudaDType + DeviceRepr, W: CudaDType>(
    [a, b]: [(&CudaStorage, &Layout); 2],
    [wa, wb]: [(&CudaStorage, &Layout); 2],
    args: &Args,
) -> Result<Tensor> {
    let device = &a.0.device;
    let width = args.width as usize;
    let mut out = output::<T>(device, 2 * args.rows * width)?;
    let (a, b) = (view::<T>(a.0, a.1, "a")?, view::<T>(b.0, b.1, "b")?);
    let (wa, wb) = (view::<W>(wa.0, wa.1, "wa")?, view::<W>(wb.0, wb.1, "wb")?);
    let mut builder = args.func.builder();
    builder.arg(&mut out).arg(&a).arg(&wa).arg(&b).arg(&wb);
    builder.arg(&args.width).arg(&args.eps).arg(&args.vector);
    // SAFETY: a and b hold rows * width elements, the weights width each, `out` 2 * rows *
    // width, which the grid's two halves write; `vector` only where all four start 16-byte
    // aligned and width is a multiple of 8.
    unsafe { builder.launch(grid((args.rows as u32, 2), RMS_BLOCK)) }.w()?;
    Ok(tensor(out, device, (args.rows, 2 * width)))
}

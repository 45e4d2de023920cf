use super::module::{function, Kernel, Module};
use super::{by_dtypes, dtype_name, grid, int, output, starts_aligned_16, tensor, view, with_expert_views};
use crate::error::bad_input;
use crate::mxfp4_experts::ExpertOutputs;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape, Storage, Tensor};

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
    if (dtype, w_dtype) == (DType::F32, DType::BF16) {
        return Err(bad_input(OP, "f32 rows with a bf16 weight: cast the weight to f32"));
    }
    let name = format!("rms_norm_{}_{}", dtype_name(OP, dtype)?, dtype_name(OP, w_dtype)?);
    // Whole vectors of 8 by one load each, where every operand allows it.
    let aligned = [Some(x), residual, Some(weight)]
        .into_iter()
        .flatten()
        .all(|(s, l)| starts_aligned_16(l, s.dtype()));
    let args = Args {
        func: function(&x.0.device, Module::RmsNorm, &name)?,
        rows,
        width: int(OP, width)?,
        eps,
        vector: i32::from(width.is_multiple_of(8) && aligned),
    };
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
    let null: u64 = 0;
    let mut builder = a.func.builder();
    builder.arg(&mut out).arg(&xs);
    match &residual {
        Some(r) => builder.arg(r),
        None => builder.arg(&null),
    };
    builder.arg(&ws).arg(&a.width).arg(&a.eps).arg(&a.vector);
    // SAFETY: x and the residual hold rows * width elements, the weight width, `out` one or
    // two times rows * width as the kernel writes; `vector` only where all start 16-byte
    // aligned and width is a multiple of 8.
    unsafe { builder.launch(grid((a.rows as u32, 1), 256)) }.w()?;
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
    if (dtype, w_dtype) == (DType::F32, DType::BF16) {
        return Err(bad_input(OP, "f32 rows with a bf16 weight: cast the weight to f32"));
    }
    let (rs, rl) = residual.storage_and_layout();
    let (ws, wl) = weight.storage_and_layout();
    let (Storage::Cuda(rs), Storage::Cuda(ws)) = (&*rs, &*ws) else {
        return Err(bad_input(OP, "the residual and the weight must be on the GPU"));
    };
    let name = format!(
        "experts_add_rms_norm_{}_{}",
        dtype_name(OP, dtype)?,
        dtype_name(OP, w_dtype)?
    );
    let vector = width.is_multiple_of(8) && starts_aligned_16(rl, dtype) && starts_aligned_16(wl, w_dtype);
    let args = Args {
        func: function(&rs.device, Module::RmsNorm, &name)?,
        rows: o.rows,
        width: int(OP, width)?,
        eps,
        vector: i32::from(vector),
    };
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
        // only where both start 16-byte aligned and width is a multiple of 8.
        unsafe { builder.launch(grid((a.rows as u32, 1), 256)) }.w()?;
        Ok(())
    })?;
    Ok(tensor(out, device, (2, a.rows, a.width as usize)))
}

use super::module::{function, Kernel, Module};
use super::{by_dtypes, dtype_name, grid, int, output, starts_aligned_16, view};
use crate::error::bad_input;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape};

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

use super::module::{function, Module};
use super::{by_dtype, dtype_name, grid, int, output, view};
use crate::error::bad_input;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape};

/// Threads per row, as `kernels/argmax.cu` has them.
const THREADS: u32 = 256;

/// `kernels/argmax.cu`: `x` [rows, cols] to u32 [rows].
pub(crate) fn argmax_rows(x: (&CudaStorage, &Layout)) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "argmax_rows";
    let (rows, cols) = x.1.shape().dims2()?;
    let dtype = x.0.dtype();
    let name = format!("argmax_rows_{}", dtype_name(OP, dtype)?);
    let cols = int(OP, cols)?;
    let out = by_dtype!(OP, dtype, launch(x, rows, cols, &name))?;
    Ok((out, Shape::from(rows)))
}

fn launch<T: CudaDType + DeviceRepr>(
    x: (&CudaStorage, &Layout),
    rows: usize,
    cols: i32,
    name: &str,
) -> Result<CudaStorage> {
    let device = &x.0.device;
    let mut out = output::<u32>(device, rows)?;
    if rows > 0 {
        let input = view::<T>(x.0, x.1, "x")?;
        let func = function(device, Module::Argmax, name)?;
        let mut builder = func.builder();
        builder.arg(&mut out).arg(&input).arg(&cols);
        // SAFETY: `x` holds rows * cols elements; one block per row writes its one output.
        unsafe { builder.launch(grid((rows as u32, 1), THREADS)) }.w()?;
    }
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

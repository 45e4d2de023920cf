use super::module::{function, Module};
use super::{arg_or_null, by_dtype, dtype_name, grid, int, output, starts_aligned_16, view};
use crate::error::bad_input;
use crate::kernel_constants::ARGMAX_THREADS;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape};

/// Threads per row.
const THREADS: u32 = ARGMAX_THREADS as u32;

/// `kernels/argmax.cu`: the argmax of each of `rows` of `x` [rows, cols], u32 [rows.len()]
/// (the rows checked and not empty).
pub(crate) fn argmax_rows(x: (&CudaStorage, &Layout), rows: &[u32]) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "argmax_rows";
    let cols = x.1.shape().dims2()?.1;
    let dtype = x.0.dtype();
    let name = format!("argmax_rows_{}", dtype_name(OP, dtype)?);
    // Eight elements a load: every row then starts on a 16-byte boundary.
    let vector = i32::from(cols.is_multiple_of(8) && starts_aligned_16(x.1, dtype));
    let cols = int(OP, cols)?;
    let blocks = u32::try_from(rows.len()).map_err(|_| bad_input(OP, "too many rows"))?;
    let out = by_dtype!(OP, dtype, launch(x, rows, blocks, [cols, vector], &name))?;
    Ok((out, Shape::from(rows.len())))
}

fn launch<T: CudaDType + DeviceRepr>(
    x: (&CudaStorage, &Layout),
    rows: &[u32],
    blocks: u32,
    [cols, vector]: [i32; 2],
    name: &str,
) -> Result<CudaStorage> {
    let device = &x.0.device;
    let mut out = output::<u32>(device, rows.len())?;
    let input = view::<T>(x.0, x.1, "x")?;
    // Every row in order, as a decode or verification step asks: the kernel's null list.
    let every = rows.iter().enumerate().all(|(i, &r)| r as usize == i);
    let uploaded = if every { None } else { Some(device.clone_htod(rows)?) };
    let func = function(device, Module::Argmax, name)?;
    let mut builder = func.builder();
    builder.arg(&mut out).arg(&input);
    arg_or_null(&mut builder, uploaded.as_ref());
    builder.arg(&cols).arg(&vector);
    // SAFETY: every requested row lies in `x` (checked by the caller), which holds rows * cols
    // elements; one block per requested row writes its one output.
    unsafe { builder.launch(grid((blocks, 1), THREADS)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

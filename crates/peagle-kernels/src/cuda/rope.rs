use super::module::{function, Kernel, Module};
use super::{by_dtype, dtype_name, grid, int, output, row_blocks, strided_view, view};
use crate::error::bad_input;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape};

/// `kernels/rope.cu`: `x` [rows, width], rows possibly strided, rotated per `head_dim` head by
/// `cos` and `sin` [rows, head_dim / 2] (f32, shapes already checked).
pub(crate) fn rope(
    x: (&CudaStorage, &Layout),
    cos: (&CudaStorage, &Layout),
    sin: (&CudaStorage, &Layout),
    head_dim: usize,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "rope";
    let (rows, width) = x.1.shape().dims2()?;
    let dtype = x.0.dtype();
    let device = x.0.device.clone();
    let args = Args {
        func: function(&device, Module::Rope, &format!("rope_{}", dtype_name(OP, dtype)?))?,
        rows,
        ints: [int(OP, width)?, int(OP, head_dim)?],
    };
    let cos = view::<f32>(cos.0, cos.1, "cos")?;
    let sin = view::<f32>(sin.0, sin.1, "sin")?;
    let out = by_dtype!(OP, dtype, launch(x, &cos, &sin, &args))?;
    Ok((out, Shape::from((rows, width))))
}

struct Args {
    func: Kernel,
    rows: usize,
    /// width, head_dim.
    ints: [i32; 2],
}

fn launch<T: CudaDType + DeviceRepr>(
    x: (&CudaStorage, &Layout),
    cos: &CudaView<f32>,
    sin: &CudaView<f32>,
    a: &Args,
) -> Result<CudaStorage> {
    let device = &x.0.device;
    let mut out = output::<T>(device, a.rows * a.ints[0] as usize)?;
    let (xs, stride) = strided_view::<T>(x.0, x.1, "rope", "the input")?;
    let mut builder = a.func.builder();
    builder.arg(&mut out).arg(&xs).arg(cos).arg(sin);
    for v in &a.ints {
        builder.arg(v);
    }
    builder.arg(&stride);
    // SAFETY: the view spans the rows of x, `stride` apart, and cos and sin hold
    // rows * head_dim / 2 values (checked by the caller).
    unsafe { builder.launch(grid((a.rows as u32, row_blocks(a.ints[0] as usize / 2, 128)), 128)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

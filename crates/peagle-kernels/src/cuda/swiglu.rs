use super::module::{function, Kernel, Module};
use super::{by_dtype, dtype_name, grid, int, output, view};
use crate::error::bad_input;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape};

/// `kernels/swiglu.cu`: `gate_up` [rows, 2 * width] to [rows, width].
pub(crate) fn swiglu(gate_up: (&CudaStorage, &Layout), rows: usize, width: usize) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "swiglu";
    let dtype = gate_up.0.dtype();
    let args = Args {
        func: function(
            &gate_up.0.device,
            Module::Swiglu,
            &format!("swiglu_{}", dtype_name(OP, dtype)?),
        )?,
        rows: int(OP, rows)?,
        width: int(OP, width)?,
    };
    let out = by_dtype!(OP, dtype, launch(gate_up, &args))?;
    Ok((out, Shape::from((rows, width))))
}

struct Args {
    func: Kernel,
    rows: i32,
    width: i32,
}

fn launch<T: CudaDType + DeviceRepr>(gate_up: (&CudaStorage, &Layout), a: &Args) -> Result<CudaStorage> {
    let device = &gate_up.0.device;
    let total = a.rows as usize * a.width as usize;
    let mut out = output::<T>(device, total)?;
    let input = view::<T>(gate_up.0, gate_up.1, "gate_up")?;
    let mut builder = a.func.builder();
    builder.arg(&mut out).arg(&input).arg(&a.rows).arg(&a.width);
    // A grid-stride loop: enough blocks to fill the GPU, never more than the elements need.
    let blocks = total.div_ceil(256).clamp(1, 4096) as u32;
    // SAFETY: `gate_up` holds rows * 2 * width elements, `out` rows * width.
    unsafe { builder.launch(grid((blocks, 1), 256)) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

use super::module::{function, Kernel, Module};
use super::{by_dtypes, dtype_name, int, output, view};
use crate::error::bad_input;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape};

/// Rows of x and output columns per block, as `kernels/linear.cu` has them.
const ROWS: usize = 8;
const COLUMNS: usize = 8;

/// `kernels/linear.cu`: `x` [M, K] times `w` [N, K] transposed, [M, N] in x's dtype.
pub(crate) fn linear(x: (&CudaStorage, &Layout), w: (&CudaStorage, &Layout)) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "linear";
    let (m, k) = x.1.shape().dims2()?;
    let (n, w_k) = w.1.shape().dims2()?;
    if k != w_k {
        return Err(bad_input(OP, format!("x has {k} columns, the weight {w_k}")));
    }
    if k % 8 != 0 {
        return Err(bad_input(
            OP,
            format!("{k} input features: the CUDA kernel reads them 8 at a time"),
        ));
    }
    let (x_dtype, w_dtype) = (x.0.dtype(), w.0.dtype());
    if (x_dtype, w_dtype) == (DType::BF16, DType::F32) {
        return Err(bad_input(
            OP,
            "bf16 activations with an f32 weight: cast the weight to bf16",
        ));
    }
    for (what, l, dtype) in [("x", x.1, x_dtype), ("weight", w.1, w_dtype)] {
        if l.start_offset() * dtype.size_in_bytes() % 16 != 0 {
            return Err(bad_input(OP, format!("{what} does not start on a 16-byte boundary")));
        }
    }
    let device = x.0.device.clone();
    let name = format!("linear_{}_{}", dtype_name(OP, x_dtype)?, dtype_name(OP, w_dtype)?);
    let args = Args {
        func: function(&device, Module::Linear, &name)?,
        dims: [int(OP, m)?, int(OP, n)?, int(OP, k)?],
    };
    let out = by_dtypes!(OP, (x_dtype, w_dtype), launch(x, w, &args))?;
    Ok((out, Shape::from((m, n))))
}

struct Args {
    func: Kernel,
    /// M, N, K.
    dims: [i32; 3],
}

fn launch<T: CudaDType + DeviceRepr, W: CudaDType>(
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    a: &Args,
) -> Result<CudaStorage> {
    let device = &x.0.device;
    let [m, n, _] = a.dims.map(|d| d as usize);
    let mut out = output::<T>(device, m * n)?;
    let xs = view::<T>(x.0, x.1, "x")?;
    let ws = view::<W>(w.0, w.1, "weight")?;
    let mut builder = a.func.builder();
    builder.arg(&mut out).arg(&xs).arg(&ws);
    for d in &a.dims {
        builder.arg(d);
    }
    let config = LaunchConfig {
        grid_dim: (m.div_ceil(ROWS) as u32, n.div_ceil(COLUMNS) as u32, 1),
        block_dim: (32 * COLUMNS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: shapes checked above; K is a multiple of 8 and both operands are 16-byte
    // aligned, as the kernel's vector loads need.
    unsafe { builder.launch(config) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

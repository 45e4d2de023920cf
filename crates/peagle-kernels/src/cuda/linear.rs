use super::module::{function, Kernel, Module};
use super::{aligned_16, by_dtypes_or_fp8, dtype_name, dtype_name_or_fp8, int, output, view};
use crate::error::{bad_input, matmul_dims};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape};

/// Warps per block, as `kernels/linear.cu` has them.
const WARPS: usize = 8;

/// How a kernel of `kernels/linear.cu` splits the work: rows of x and output columns a warp.
#[derive(Clone, Copy)]
enum Form {
    /// `_row`: one row, one column.
    Row,
    /// 8 rows, one column.
    Rows,
    /// `_wide`: 8 rows, 4 columns.
    Wide,
}

impl Form {
    /// Every form computes each element by the same chain (`kernels/linear.cu`), so a row's
    /// bits do not depend on which one its batch's size picks.
    fn for_rows(m: usize) -> Self {
        match m {
            1 => Self::Row,
            2..=8 => Self::Rows,
            _ => Self::Wide,
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Self::Row => "_row",
            Self::Rows => "",
            Self::Wide => "_wide",
        }
    }

    fn rows_per_warp(self) -> usize {
        match self {
            Self::Row => 1,
            Self::Rows | Self::Wide => 8,
        }
    }

    fn columns_per_warp(self) -> usize {
        match self {
            Self::Row | Self::Rows => 1,
            Self::Wide => 4,
        }
    }
}

/// An FP8 weight's block scales [ceil(N / bn), ceil(K / bk)] (f32) and its block (bn, bk).
pub(crate) type BlockScales<'a> = ((&'a CudaStorage, &'a Layout), (usize, usize));

/// `kernels/linear.cu`: `x` [M, K] times `w` [N, K] transposed, [M, N] in x's dtype; an FP8
/// weight with its block scales.
pub(crate) fn linear(
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    scales: Option<BlockScales>,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "linear";
    let (m, k, n) = matmul_dims(OP, x.1.shape(), w.1.shape())?;
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
        aligned_16(OP, what, l, dtype)?;
    }
    let device = x.0.device.clone();
    if (w_dtype == DType::F8E4M3) != scales.is_some() {
        return Err(bad_input(
            OP,
            "an FP8 weight needs its block scales, and only an FP8 weight has them",
        ));
    }
    let form = Form::for_rows(m);
    let name = format!(
        "linear_{}_{}{}",
        dtype_name(OP, x_dtype)?,
        dtype_name_or_fp8(OP, w_dtype)?,
        form.suffix()
    );
    let (block_n, block_k) = scales.map_or((1, 8), |(_, block)| block);
    let args = Args {
        func: function(&device, Module::Linear, &name)?,
        form,
        dims: [int(OP, m)?, int(OP, n)?, int(OP, k)?],
        scales: scales.map(|((s, l), _)| view::<f32>(s, l, "scales")).transpose()?,
        block: [int(OP, block_n)?, int(OP, block_k)?],
    };
    let out = by_dtypes_or_fp8!(OP, (x_dtype, w_dtype), launch(x, w, &args))?;
    Ok((out, Shape::from((m, n))))
}

struct Args<'a> {
    func: Kernel,
    form: Form,
    /// M, N, K.
    dims: [i32; 3],
    scales: Option<CudaView<'a, f32>>,
    /// block_n, block_k of the scales (unread without them).
    block: [i32; 2],
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
    let null: u64 = 0;
    let mut builder = a.func.builder();
    builder.arg(&mut out).arg(&xs).arg(&ws);
    for d in &a.dims {
        builder.arg(d);
    }
    match &a.scales {
        Some(s) => builder.arg(s),
        None => builder.arg(&null),
    };
    builder.arg(&a.block[0]).arg(&a.block[1]);
    let config = LaunchConfig {
        grid_dim: (
            m.div_ceil(a.form.rows_per_warp()) as u32,
            n.div_ceil(WARPS * a.form.columns_per_warp()) as u32,
            1,
        ),
        block_dim: (32 * WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: shapes checked above; K is a multiple of 8 and both operands are 16-byte
    // aligned, as the kernel's vector loads need; FP8 scales were checked against the weight
    // and its block (`Fp8Weight::new`), whose width is a multiple of 8.
    unsafe { builder.launch(config) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

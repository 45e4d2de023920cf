use super::module::{function, Module};
use super::{by_dtype, dtype_name, grid, int, output, tensor, with_view};
use crate::error::bad_input;
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, WrapErr};
use candle_core::{DType, Result, Tensor};

/// Threads per row, as `kernels/gather_rows.cu` has them.
const THREADS: u32 = 256;

/// `kernels/gather_rows.cu`: row i of the output [picks, cols] is row `picks[i]` of `first`
/// [a, cols], or of `second` past its a rows (the tables contiguous on one GPU, of one dtype,
/// every pick within them, some picks; `into`, where given, contiguous [picks, cols] of their
/// dtype: checked by the caller). Returns the output: `into`, or a new tensor.
pub(crate) fn gather_rows(first: &Tensor, second: &Tensor, picks: &[u32], into: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "gather_rows";
    let (a, cols) = first.dims2()?;
    let dtype = first.dtype();
    let name = format!("gather_rows_{}", dtype_name(OP, dtype)?);
    let sizes = [int(OP, a)?, int(OP, cols)?];
    by_dtype!(OP, dtype, launch(first, second, picks, into, sizes, &name))
}

fn launch<T: CudaDType + DeviceRepr>(
    first: &Tensor,
    second: &Tensor,
    picks: &[u32],
    into: Option<&Tensor>,
    [first_rows, cols]: [i32; 2],
    name: &str,
) -> Result<Tensor> {
    let device = first.device().as_cuda_device()?;
    let uploaded = device.clone_htod(picks)?;
    let func = function(device, Module::GatherRows, name)?;
    let run = |out: &CudaView<'_, T>| {
        with_view::<T, _>(first, "first", |first| {
            with_view::<T, _>(second, "second", |second| {
                let mut builder = func.builder();
                builder.arg(out).arg(&first).arg(&second).arg(&uploaded);
                builder.arg(&first_rows).arg(&cols);
                // SAFETY: every pick lies in `first` (its first_rows rows of cols elements) or
                // in `second` past them (checked by the caller); one block per pick writes its
                // row of `out`, which holds picks * cols elements.
                unsafe { builder.launch(grid((picks.len() as u32, 1), THREADS)) }.w()
            })
        })
    };
    match into {
        Some(out) => {
            with_view::<T, _>(out, "out", |view| run(&view))?;
            Ok(out.clone())
        }
        None => {
            let out = output::<T>(device, picks.len() * cols as usize)?;
            run(&out.slice(..))?;
            Ok(tensor(out, device, (picks.len(), cols as usize)))
        }
    }
}

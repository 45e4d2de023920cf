//! Launchers of the kernels that choose from a step's logits: one block per requested row;
//! each request's row, temperature and a value of its own are uploaded.

use super::module::{function, Module};
use super::{by_dtype, dtype_name, grid, int, output, view};
use crate::error::bad_input;
use crate::gumbel_sample::GumbelRequest;
use crate::row_candidates::CandidateRequest;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result};

/// `kernels/row_candidates.cu`: `out_per_row` words per request (1 <= count).
pub(crate) fn row_candidates(
    logits: (&CudaStorage, &Layout),
    requests: &[CandidateRequest],
    count: usize,
    out_per_row: usize,
) -> Result<CudaStorage> {
    const OP: &str = "row_candidates";
    let kernel = Kernel {
        op: OP,
        module: Module::RowCandidates,
        threads: 1024,
        rows: requests.iter().map(|r| (r.row as u32, r.temperature)).unzip(),
        out_per_row,
    };
    let thresholds: Vec<f64> = requests.iter().flat_map(|r| [r.lo, r.hi]).collect();
    let cols = int(OP, logits.1.shape().dims2()?.1)?;
    by_dtype!(
        OP,
        logits.0.dtype(),
        launch(&kernel, logits, &thresholds, &[cols, int(OP, count)?])
    )
}

/// `kernels/gumbel_sample.cu`: one token per request.
pub(crate) fn gumbel_sample(logits: (&CudaStorage, &Layout), requests: &[GumbelRequest]) -> Result<CudaStorage> {
    const OP: &str = "gumbel_sample";
    let kernel = Kernel {
        op: OP,
        module: Module::GumbelSample,
        threads: 256,
        rows: requests.iter().map(|r| (r.row as u32, r.temperature)).unzip(),
        out_per_row: 1,
    };
    let keys: Vec<u64> = requests.iter().map(|r| r.key).collect();
    let cols = int(OP, logits.1.shape().dims2()?.1)?;
    by_dtype!(OP, logits.0.dtype(), launch(&kernel, logits, &keys, &[cols]))
}

/// A kernel of `(out, logits, rows, temperatures, per_request, ints..)` and its requests.
struct Kernel {
    op: &'static str,
    module: Module,
    /// Threads per block, as the kernel's file has them.
    threads: u32,
    rows: (Vec<u32>, Vec<f32>),
    out_per_row: usize,
}

fn launch<T: CudaDType + DeviceRepr>(
    kernel: &Kernel,
    logits: (&CudaStorage, &Layout),
    per_request: &[impl DeviceRepr + 'static],
    ints: &[i32],
) -> Result<CudaStorage> {
    let device = &logits.0.device;
    let mut out = output::<u32>(device, kernel.rows.0.len() * kernel.out_per_row)?;
    if !kernel.rows.0.is_empty() {
        let name = format!("{}_{}", kernel.op, dtype_name(kernel.op, logits.0.dtype())?);
        let blocks = u32::try_from(kernel.rows.0.len()).map_err(|_| bad_input(kernel.op, "too many requests"))?;
        let input = view::<T>(logits.0, logits.1, "logits")?;
        let rows = device.clone_htod(&kernel.rows.0)?;
        let temperatures = device.clone_htod(&kernel.rows.1)?;
        let per_request = device.clone_htod(per_request)?;
        let func = function(device, kernel.module, &name)?;
        let mut builder = func.builder();
        builder
            .arg(&mut out)
            .arg(&input)
            .arg(&rows)
            .arg(&temperatures)
            .arg(&per_request);
        for int in ints {
            builder.arg(int);
        }
        // SAFETY: every requested row lies in `logits` and the sizes are in the kernel's range
        // (checked in `requested_rows.rs` and by the callers); one block per request writes
        // its `out_per_row` words.
        unsafe { builder.launch(grid((blocks, 1), kernel.threads)) }.w()?;
    }
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

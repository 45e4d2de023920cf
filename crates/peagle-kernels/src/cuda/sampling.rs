//! Launchers of the kernels that choose from a step's logits: blocks per requested row; each
//! request's row, temperature and a value of its own are uploaded.

use super::module::{function, Module};
use super::{by_dtype, dtype_name, grid, int, output, view};
use crate::error::bad_input;
use crate::gumbel_sample::GumbelRequest;
use crate::row_candidates::CandidateRequest;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
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

/// Logits a block of `kernels/gumbel_sample.cu` draws from, and its threads, as the file has
/// them.
const GUMBEL_CHUNK: usize = 4096;
const GUMBEL_THREADS: u32 = 256;

/// `kernels/gumbel_sample.cu`: one token per request, each row dealt to blocks a chunk at a
/// time (one launch where a row is one chunk, three where it is more).
pub(crate) fn gumbel_sample(logits: (&CudaStorage, &Layout), requests: &[GumbelRequest]) -> Result<CudaStorage> {
    const OP: &str = "gumbel_sample";
    let cols = logits.1.shape().dims2()?.1;
    let device = &logits.0.device;
    let mut out = output::<u32>(device, requests.len())?;
    if !requests.is_empty() {
        by_dtype!(OP, logits.0.dtype(), launch_gumbel(logits, requests, cols, &mut out))?;
    }
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

fn launch_gumbel<T: CudaDType + DeviceRepr>(
    logits: (&CudaStorage, &Layout),
    requests: &[GumbelRequest],
    cols: usize,
    out: &mut CudaSlice<u32>,
) -> Result<()> {
    const OP: &str = "gumbel_sample";
    let device = &logits.0.device;
    let dtype = dtype_name(OP, logits.0.dtype())?;
    let n = requests.len();
    let chunks = cols.div_ceil(GUMBEL_CHUNK).max(1);
    let blocks = (
        u32::try_from(n).map_err(|_| bad_input(OP, "too many requests"))?,
        u32::try_from(chunks).map_err(|_| bad_input(OP, "too many logits a row"))?,
    );
    // The kernels index the partials [request * chunks + chunk] with 32-bit integers.
    int(OP, n * chunks)?;
    let (n_i, chunks_i, cols_i) = (int(OP, n)?, int(OP, chunks)?, int(OP, cols)?);
    let input = view::<T>(logits.0, logits.1, "logits")?;
    let rows = device.clone_htod(&requests.iter().map(|r| r.row as u32).collect::<Vec<_>>())?;
    let temperatures = device.clone_htod(&requests.iter().map(|r| r.temperature).collect::<Vec<_>>())?;
    let keys = device.clone_htod(&requests.iter().map(|r| r.key).collect::<Vec<_>>())?;
    // Each chunk's max and best; a row of one chunk leaves them unwritten and unread.
    let mut maxes = output::<f32>(device, n * chunks)?;
    let mut bests = output::<f64>(device, n * chunks)?;
    let mut indices = output::<i32>(device, n * chunks)?;
    if chunks > 1 {
        let func = function(device, Module::GumbelSample, &format!("gumbel_chunk_max_{dtype}"))?;
        let mut b = func.builder();
        b.arg(&mut maxes).arg(&input).arg(&rows).arg(&cols_i);
        // SAFETY: every requested row lies in `logits` (checked by the caller); block (r, c)
        // reads chunk c of request r's row and writes maxes[r * chunks + c].
        unsafe { b.launch(grid(blocks, GUMBEL_THREADS)) }.w()?;
    }
    let func = function(device, Module::GumbelSample, &format!("gumbel_sample_{dtype}"))?;
    let mut b = func.builder();
    b.arg(&mut *out).arg(&mut bests).arg(&mut indices).arg(&maxes);
    b.arg(&input).arg(&rows).arg(&temperatures).arg(&keys).arg(&cols_i);
    // SAFETY: as above; one chunk a row writes out[r], more write their partials.
    unsafe { b.launch(grid(blocks, GUMBEL_THREADS)) }.w()?;
    if chunks > 1 {
        let func = function(device, Module::GumbelSample, "gumbel_pick")?;
        let mut b = func.builder();
        b.arg(out)
            .arg(&bests)
            .arg(&indices)
            .arg(&n_i)
            .arg(&chunks_i)
            .arg(&cols_i);
        // SAFETY: one thread per request reads its `chunks` partials and writes out[r].
        unsafe { b.launch(grid((n.div_ceil(256) as u32, 1), 256)) }.w()?;
    }
    Ok(())
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

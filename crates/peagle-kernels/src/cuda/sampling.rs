//! Launchers of the kernels that choose from a step's logits: blocks per requested row; each
//! request's row, temperature and a value of its own are uploaded.

use super::module::{function, Module};
use super::{by_dtype, dtype_name, grid, int, output, view};
use crate::error::bad_input;
use crate::gumbel_sample::GumbelRequest;
use crate::kernel_constants::{GUMBEL_CHUNK, GUMBEL_THREADS, ROW_CANDIDATE_THREADS};
use crate::row_candidates::CandidateRequest;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result};

/// `kernels/row_candidates.cu`: `out_per_row` words per request (1 <= count).
pub(crate) fn row_candidates(
    logits: (&CudaStorage, &Layout),
    requests: &[CandidateRequest],
    count: usize,
    out_per_row: usize,
) -> Result<CudaStorage> {
    const OP: &str = "row_candidates";
    let cols = int(OP, logits.1.shape().dims2()?.1)?;
    let device = &logits.0.device;
    let mut out = output::<u32>(device, requests.len() * out_per_row)?;
    if !requests.is_empty() {
        let ints = [cols, int(OP, count)?];
        by_dtype!(
            OP,
            logits.0.dtype(),
            launch_row_candidates(logits, requests, ints, &mut out)
        )?;
    }
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

/// Threads per block.
const CANDIDATE_THREADS: u32 = ROW_CANDIDATE_THREADS as u32;

fn launch_row_candidates<T: CudaDType + DeviceRepr>(
    logits: (&CudaStorage, &Layout),
    requests: &[CandidateRequest],
    [cols, count]: [i32; 2],
    out: &mut CudaSlice<u32>,
) -> Result<()> {
    const OP: &str = "row_candidates";
    let device = &logits.0.device;
    let blocks = u32::try_from(requests.len()).map_err(|_| bad_input(OP, "too many requests"))?;
    let input = view::<T>(logits.0, logits.1, "logits")?;
    let thresholds: Vec<f64> = requests.iter().flat_map(|r| [r.lo, r.hi]).collect();
    let up = upload(device, requests.iter().map(|r| (r.row, r.temperature)), &thresholds)?;
    let name = format!("{OP}_{}", dtype_name(OP, logits.0.dtype())?);
    let func = function(device, Module::RowCandidates, &name)?;
    let mut b = func.builder();
    b.arg(out)
        .arg(&input)
        .arg(&up.rows)
        .arg(&up.temperatures)
        .arg(&up.per_request);
    b.arg(&cols).arg(&count);
    // SAFETY: every requested row lies in `logits` and the sizes are in the kernel's range
    // (checked in `requested_rows.rs` and by the callers); one block per request writes its
    // `out_per_row` words.
    unsafe { b.launch(grid((blocks, 1), CANDIDATE_THREADS)) }.w()?;
    Ok(())
}

/// Each request's row, temperature and value of its own, on the device: what every kernel
/// here reads of its requests.
struct Uploaded<P> {
    rows: CudaSlice<u32>,
    temperatures: CudaSlice<f32>,
    per_request: CudaSlice<P>,
}

fn upload<P: DeviceRepr + 'static>(
    device: &CudaDevice,
    rows: impl Iterator<Item = (usize, f32)>,
    per_request: &[P],
) -> Result<Uploaded<P>> {
    let (rows, temperatures): (Vec<u32>, Vec<f32>) = rows.map(|(row, t)| (row as u32, t)).unzip();
    Ok(Uploaded {
        rows: device.clone_htod(&rows)?,
        temperatures: device.clone_htod(&temperatures)?,
        per_request: device.clone_htod(per_request)?,
    })
}

/// Threads a block of `kernels/gumbel_sample.cu`.
const GUMBEL_BLOCK: u32 = GUMBEL_THREADS as u32;

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
    let keys: Vec<u64> = requests.iter().map(|r| r.key).collect();
    let up = upload(device, requests.iter().map(|r| (r.row, r.temperature)), &keys)?;
    // Each chunk's max and best; a row of one chunk leaves them unwritten and unread.
    let mut maxes = output::<f32>(device, n * chunks)?;
    let mut bests = output::<f64>(device, n * chunks)?;
    let mut indices = output::<i32>(device, n * chunks)?;
    if chunks > 1 {
        let func = function(device, Module::GumbelSample, &format!("gumbel_chunk_max_{dtype}"))?;
        let mut b = func.builder();
        b.arg(&mut maxes).arg(&input).arg(&up.rows).arg(&cols_i);
        // SAFETY: every requested row lies in `logits` (checked by the caller); block (r, c)
        // reads chunk c of request r's row and writes maxes[r * chunks + c].
        unsafe { b.launch(grid(blocks, GUMBEL_BLOCK)) }.w()?;
    }
    let func = function(device, Module::GumbelSample, &format!("gumbel_sample_{dtype}"))?;
    let mut b = func.builder();
    b.arg(&mut *out).arg(&mut bests).arg(&mut indices).arg(&maxes);
    b.arg(&input)
        .arg(&up.rows)
        .arg(&up.temperatures)
        .arg(&up.per_request)
        .arg(&cols_i);
    // SAFETY: as above; one chunk a row writes out[r], more write their partials.
    unsafe { b.launch(grid(blocks, GUMBEL_BLOCK)) }.w()?;
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

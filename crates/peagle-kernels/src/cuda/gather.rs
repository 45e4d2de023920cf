use super::module::{function, Module};
use super::{by_dtype, dtype_name, grid, int, output, tensor, with_view, with_views};
use crate::error::bad_input;
use crate::kernel_constants::{GATHER_THREADS, TAKE_THREADS};
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaDevice, WrapErr};
use candle_core::{DType, Result, Tensor};

/// Threads per row.
const THREADS: u32 = GATHER_THREADS as u32;

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
    into_or_new(device, into, (picks.len(), cols as usize), run)
}

/// The tensors of `kernels/gather_rows.cu`'s chain_drafts (checked by the caller): the last
/// pass's ids u32 [kept] and hidden outputs [kept, cols], the map u32 [vocab], and the next
/// pass's tokens u32 [picks] and the drafts u32 [at most picks], contiguous on one GPU.
pub(crate) struct ChainTensors<'a> {
    pub ids: &'a Tensor,
    pub hidden: &'a Tensor,
    pub to_target: &'a Tensor,
    pub tokens: &'a Tensor,
    pub drafts: &'a Tensor,
}

/// `kernels/gather_rows.cu`'s chain_drafts: the next pass's hidden input, returned (`into`, or a
/// new tensor [picks, cols]), and its tokens and the drafts written where `t` says.
pub(crate) fn chain_drafts(t: &ChainTensors, picks: &[u32], into: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "chain_drafts";
    let dtype = t.hidden.dtype();
    let name = format!("chain_drafts_{}", dtype_name(OP, dtype)?);
    by_dtype!(OP, dtype, launch_chain(t, picks, into, &name))
}

fn launch_chain<T: CudaDType + DeviceRepr>(
    t: &ChainTensors,
    picks: &[u32],
    into: Option<&Tensor>,
    name: &str,
) -> Result<Tensor> {
    const OP: &str = "chain_drafts";
    let cols = t.hidden.dim(1)?;
    let vocab = int(OP, t.to_target.dim(0)?)?;
    let drafts_rows = int(OP, t.drafts.dim(0)?)?;
    let cols_arg = int(OP, cols)?;
    let device = t.hidden.device().as_cuda_device()?;
    let uploaded = device.clone_htod(picks)?;
    let func = function(device, Module::GatherRows, name)?;
    let u32s = [
        (t.ids, "ids"),
        (t.to_target, "to_target"),
        (t.tokens, "tokens"),
        (t.drafts, "drafts"),
    ];
    let run = |out: &CudaView<'_, T>| {
        with_view::<T, _>(t.hidden, "hidden", |hidden| {
            with_views::<u32, _, 4>(u32s, |[ids, to_target, tokens, drafts]| {
                let mut builder = func.builder();
                builder.arg(out).arg(&tokens).arg(&drafts).arg(&hidden).arg(&ids);
                builder.arg(&to_target).arg(&uploaded);
                builder.arg(&vocab).arg(&drafts_rows).arg(&cols_arg);
                // SAFETY: every pick is a row of `ids` and `hidden`, and `tokens` holds a
                // token a pick (checked by the caller); one block per pick writes its token,
                // its row of `out` (picks * cols elements) and, among the first drafts_rows
                // (at most picks), its draft; the kernel reads `to_target` only below its
                // vocab entries.
                unsafe { builder.launch(grid((picks.len() as u32, 1), THREADS)) }.w()
            })
        })
    };
    into_or_new(device, into, (picks.len(), cols), run)
}

/// Threads a block of take_ids, one an id.
const TAKE_BLOCK: u32 = TAKE_THREADS as u32;

/// `kernels/gather_rows.cu`'s take_ids: `out[at[j]] = map[ids[picks[j]]]`, or `ids[picks[j]]`
/// without a map (contiguous u32 vectors on one GPU, every place and pick within them, no
/// place twice, some places: checked by the caller).
pub(crate) fn take_ids(out: &Tensor, at: &[u32], ids: &Tensor, picks: &[u32], map: Option<&Tensor>) -> Result<()> {
    const OP: &str = "take_ids";
    let n = int(OP, at.len())?;
    // A negative vocabulary tells the kernel there is no map to read.
    let vocab = map.map(|m| int(OP, m.dim(0)?)).transpose()?.unwrap_or(-1);
    let device = out.device().as_cuda_device()?;
    let uploaded = device.clone_htod(&[at, picks].concat())?;
    let func = function(device, Module::GatherRows, "take_ids")?;
    let blocks = at.len().div_ceil(TAKE_THREADS) as u32;
    let launch = |out: &CudaView<'_, u32>, ids: &CudaView<'_, u32>, map: &CudaView<'_, u32>| {
        let mut builder = func.builder();
        builder.arg(out).arg(ids).arg(map).arg(&uploaded).arg(&n).arg(&vocab);
        // SAFETY: `uploaded` holds n places within `out` then n picks within `ids`, and no
        // place twice (checked by the caller); the kernel reads `map` only below its vocab
        // entries, and not at all without one.
        unsafe { builder.launch(grid((blocks, 1), TAKE_BLOCK)) }.w().map(|_| ())
    };
    with_views::<u32, _, 2>([(out, "out"), (ids, "ids")], |[out, ids]| match map {
        Some(map) => with_view::<u32, _>(map, "map", |map| launch(&out, &ids, &map)),
        None => launch(&out, &ids, &ids),
    })
}

/// `run` over `into`'s memory, returning `into`, or over a new buffer of [rows, cols], returned
/// as a tensor.
fn into_or_new<T: CudaDType + DeviceRepr, R>(
    device: &CudaDevice,
    into: Option<&Tensor>,
    (rows, cols): (usize, usize),
    run: impl FnOnce(&CudaView<'_, T>) -> Result<R>,
) -> Result<Tensor> {
    match into {
        Some(out) => {
            with_view::<T, _>(out, "out", |view| run(&view))?;
            Ok(out.clone())
        }
        None => {
            let out = output::<T>(device, rows * cols)?;
            run(&out.slice(..))?;
            Ok(tensor(out, device, (rows, cols)))
        }
    }
}

use super::module::{function, Module};
use super::{by_dtype, dtype_name, grid, int, output, tensor, with_view, with_views};
use crate::error::bad_input;
use crate::indices::Indices;
use crate::kernel_constants::{GATHER_THREADS, TAKE_THREADS};
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaDevice, WrapErr};
use candle_core::{DType, Result, Tensor};

/// Threads per row.
const THREADS: u32 = GATHER_THREADS as u32;

/// `kernels/gather_rows.cu`: row i of the output [picks, cols] is row `picks[i]` of `first`
/// [a, cols], or of `second` [b, cols] past its a rows (`second` None: no rows past `first`'s;
/// the tables contiguous on one GPU, of one dtype, every pick within them, some picks; `into`,
/// where given, contiguous [picks, cols] of their dtype: checked by the caller). Returns the
/// output: `into`, or a new tensor.
pub(crate) fn gather_rows(
    first: &Tensor,
    second: Option<&Tensor>,
    picks: &Indices,
    into: Option<&Tensor>,
) -> Result<Tensor> {
    const OP: &str = "gather_rows";
    let (a, cols) = first.dims2()?;
    let b = second.map(|s| s.dim(0)).transpose()?.unwrap_or(0);
    let dtype = first.dtype();
    let name = format!("gather_rows_{}", dtype_name(OP, dtype)?);
    let sizes = [int(OP, a)?, int(OP, a + b)?, int(OP, cols)?];
    let second = second.unwrap_or(first);
    by_dtype!(OP, dtype, launch(first, second, picks, into, sizes, &name))
}

fn launch<T: CudaDType + DeviceRepr>(
    first: &Tensor,
    second: &Tensor,
    picks: &Indices,
    into: Option<&Tensor>,
    [first_rows, rows, cols]: [i32; 3],
    name: &str,
) -> Result<Tensor> {
    let device = first.device().as_cuda_device()?;
    let [picks_on_device] = Indices::on_device([picks], first.device())?;
    let func = function(device, Module::GatherRows, name)?;
    let run = |out: &CudaView<'_, T>| {
        with_views::<T, _, 2>([(first, "first"), (second, "second")], |[first, second]| {
            with_view::<u32, _>(&picks_on_device, "picks", |picks_view| {
                let mut builder = func.builder();
                builder.arg(out).arg(&first).arg(&second).arg(&picks_view);
                builder.arg(&first_rows).arg(&rows).arg(&cols);
                // SAFETY: the kernel skips a pick past the tables' `rows` rows (first_rows of
                // `first`, then `second`'s, cols elements each); one block per pick writes its
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
pub(crate) fn chain_drafts(t: &ChainTensors, picks: &Indices, into: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "chain_drafts";
    let dtype = t.hidden.dtype();
    let name = format!("chain_drafts_{}", dtype_name(OP, dtype)?);
    by_dtype!(OP, dtype, launch_chain(t, picks, into, &name))
}

fn launch_chain<T: CudaDType + DeviceRepr>(
    t: &ChainTensors,
    picks: &Indices,
    into: Option<&Tensor>,
    name: &str,
) -> Result<Tensor> {
    const OP: &str = "chain_drafts";
    let (kept, cols) = t.hidden.dims2()?;
    let kept = int(OP, kept)?;
    let vocab = int(OP, t.to_target.dim(0)?)?;
    let drafts_rows = int(OP, t.drafts.dim(0)?)?;
    let cols_arg = int(OP, cols)?;
    let device = t.hidden.device().as_cuda_device()?;
    let [picks_on_device] = Indices::on_device([picks], t.hidden.device())?;
    let func = function(device, Module::GatherRows, name)?;
    let u32s = [
        (t.ids, "ids"),
        (t.to_target, "to_target"),
        (t.tokens, "tokens"),
        (t.drafts, "drafts"),
        (&picks_on_device, "picks"),
    ];
    let run = |out: &CudaView<'_, T>| {
        with_view::<T, _>(t.hidden, "hidden", |hidden| {
            with_views::<u32, _, 5>(u32s, |[ids, to_target, tokens, drafts, picks_view]| {
                let mut builder = func.builder();
                builder.arg(out).arg(&tokens).arg(&drafts).arg(&hidden).arg(&ids);
                builder.arg(&to_target).arg(&picks_view);
                builder.arg(&vocab).arg(&kept).arg(&drafts_rows).arg(&cols_arg);
                // SAFETY: the kernel skips a pick past the `kept` rows of `ids` and `hidden`,
                // and `tokens` holds a token a pick (checked by the caller); one block per pick
                // writes its token, its row of `out` (picks * cols elements) and, among the
                // first drafts_rows (at most picks), its draft; the kernel reads `to_target`
                // only below its vocab entries.
                unsafe { builder.launch(grid((picks.len() as u32, 1), THREADS)) }.w()
            })
        })
    };
    into_or_new(device, into, (picks.len(), cols), run)
}

/// Threads a block of take_ids, one an id.
const TAKE_BLOCK: u32 = TAKE_THREADS as u32;

/// `kernels/gather_rows.cu`'s take_ids: `out[at[j]] = map[ids[picks[j]]]`, or `ids[picks[j]]`
/// without a map, and place j without `at` (contiguous u32 vectors on one GPU, no place
/// twice, some picks: checked by the caller).
pub(crate) fn take_ids(
    out: &Tensor,
    at: Option<&Indices>,
    ids: &Tensor,
    picks: &Indices,
    map: Option<&Tensor>,
) -> Result<()> {
    const OP: &str = "take_ids";
    let n = int(OP, picks.len())?;
    let sizes = [int(OP, out.dim(0)?)?, int(OP, ids.dim(0)?)?];
    // A negative vocabulary tells the kernel there is no map to read.
    let vocab = map.map(|m| int(OP, m.dim(0)?)).transpose()?.unwrap_or(-1);
    let has_at = i32::from(at.is_some());
    let device = out.device().as_cuda_device()?;
    // Without places, the picks stand in for them: the kernel does not read them.
    let (at, picks) = match at {
        Some(at) => {
            let [at, picks] = Indices::on_device([at, picks], out.device())?;
            (at, picks)
        }
        None => {
            let [picks] = Indices::on_device([picks], out.device())?;
            (picks.clone(), picks)
        }
    };
    let func = function(device, Module::GatherRows, "take_ids")?;
    let blocks = n.unsigned_abs().div_ceil(TAKE_BLOCK);
    let tensors = [
        (out, "out"),
        (ids, "ids"),
        (map.unwrap_or(ids), "map"),
        (&at, "at"),
        (&picks, "picks"),
    ];
    with_views::<u32, _, 5>(tensors, |[out, ids, map, at, picks]| {
        let mut builder = func.builder();
        builder.arg(&out).arg(&ids).arg(&map).arg(&at).arg(&picks);
        builder.arg(&has_at).arg(&n).arg(&vocab).arg(&sizes[0]).arg(&sizes[1]);
        // SAFETY: the kernel skips a place past `out` and a pick past `ids` (their sizes), and
        // reads `map` only below its vocab entries, not at all without one.
        unsafe { builder.launch(grid((blocks, 1), TAKE_BLOCK)) }.w().map(|_| ())
    })
}

/// A u32 vector of `len` (> 0) on `device`, for a kernel to write whole.
pub(crate) fn uninitialized_u32(device: &candle_core::Device, len: usize) -> Result<Tensor> {
    let device = device.as_cuda_device()?;
    Ok(tensor(output::<u32>(device, len)?, device, len))
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

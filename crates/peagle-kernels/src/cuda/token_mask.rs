use super::module::{function, Module};
use super::{grid, int, output, view};
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::{CudaStorage, WrapErr};
use candle_core::{Layout, Result, Shape};

/// `kernels/token_mask.cu`: `x` [rows, vocab] f32 with the tokens `allowed` [rows, words]
/// leaves out at -inf; at least one row.
pub(crate) fn mask_tokens(
    x: (&CudaStorage, &Layout),
    allowed: (&CudaStorage, &Layout),
    rows: usize,
    vocab: usize,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "mask_tokens";
    let device = &x.0.device;
    let func = function(device, Module::TokenMask, "mask_tokens_f32")?;
    let total = rows * vocab;
    let mut out = output::<f32>(device, total)?;
    let input = view::<f32>(x.0, x.1, "x")?;
    let bits = view::<u32>(allowed.0, allowed.1, "allowed")?;
    let (rows_arg, vocab_arg, words_arg) = (int(OP, rows)?, int(OP, vocab)?, int(OP, vocab.div_ceil(32))?);
    let mut builder = func.builder();
    builder
        .arg(&mut out)
        .arg(&input)
        .arg(&bits)
        .arg(&rows_arg)
        .arg(&vocab_arg)
        .arg(&words_arg);
    // A grid-stride loop: enough blocks to fill the GPU, never more than the elements need.
    let blocks = total.div_ceil(256).clamp(1, 4096) as u32;
    // SAFETY: `x` and `out` hold rows * vocab values, `allowed` rows * words words (the caller
    // checked the shapes).
    unsafe { builder.launch(grid((blocks, 1), 256)) }.w()?;
    Ok((
        CudaStorage::wrap_cuda_slice(out, device.clone()),
        Shape::from((rows, vocab)),
    ))
}

//! The ops layer: the only place that decides how an operation runs. Layers call these
//! functions and never look at a tensor's device themselves.
//!
//! The rule, per call:
//! - a CPU tensor in an inference pass (no gradient tracked) takes the batch-invariant CPU
//!   kernel of `peagle-kernels`;
//! - a CUDA tensor in an inference pass takes `peagle-kernels`' CUDA kernel (`kernels/*.cu`),
//!   batch invariant too: the matmul is `invariant_matmul`, never cuBLAS, whose choice of
//!   algorithm changes with the number of rows;
//! - a pass that tracks gradients (training) takes composed candle ops, which have a backward:
//!   an op whose input or whose parameter is tracked (a trained weight projecting captured
//!   data that is not).
//!
//! `check_inference_device` refuses a device with no kernels before a model is loaded.

mod weight;

pub use weight::Weight;

use candle_core::{bail, Device, Result, Tensor};
use peagle_kernels::{AttentionMetadata, AttentionParams, KvScale, MmaTiles, Rotation, Sinks};

/// Which implementation an op takes for its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// `peagle-kernels`: CPU, inference.
    CpuKernel,
    /// Differentiable candle ops: training passes.
    Autograd,
    /// candle's fused op on another device.
    Device,
}

fn path(x: &Tensor) -> Path {
    if x.track_op() {
        Path::Autograd
    } else if x.device().is_cpu() {
        Path::CpuKernel
    } else {
        Path::Device
    }
}

/// Refuses a device the inference engine has no kernels for, before anything is loaded.
pub fn check_inference_device(device: &Device) -> Result<()> {
    if device.is_cpu() || device.is_cuda() {
        return Ok(());
    }
    bail!(
        "inference on {} is not supported: peagle has kernels for the CPU and CUDA",
        device_name(device)
    )
}

fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// A plain weight and a bias in an inference pass on a GPU, for its kernel: None where either
/// is trained (the kernels have no backward) or `x` is not on a GPU in an inference pass.
fn inference_weight<'a>(x: &Tensor, w: &'a Weight, bias: Option<&Tensor>) -> Option<&'a Tensor> {
    match (w, path(x)) {
        (Weight::Plain(w), Path::Device) if !w.track_op() && !bias.is_some_and(Tensor::track_op) => Some(w),
        _ => None,
    }
}

/// `x` [rows, in] times `w` [out, in] transposed, plus `bias` [out] where given: [rows, out].
/// On a GPU a plain weight's bias is added in the matmul's own launch, to each element's f32
/// sum before its rounding; elsewhere it is added to the product.
pub fn linear(x: &Tensor, w: &Weight, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some(w) = inference_weight(x, w, bias) {
        return peagle_kernels::invariant_linear(&x.contiguous()?, w, bias, None);
    }
    let product = product(x, w)?;
    match bias {
        Some(b) => product.broadcast_add(b),
        None => Ok(product),
    }
}

/// `x` [rows, in] times `w` [out, in] transposed: [rows, out].
fn product(x: &Tensor, w: &Weight) -> Result<Tensor> {
    match (w, path(x)) {
        (Weight::Packed(p), Path::CpuKernel) => peagle_kernels::linear(x, p),
        (Weight::Mxfp4(m), Path::CpuKernel) => peagle_kernels::mxfp4_linear(x, m),
        (Weight::Mxfp4(_), _) => bail!("MXFP4 weights run on the CPU kernel only, for inference"),
        // A pass that tracks gradients through a frozen weight multiplies by its unpacked copy.
        (Weight::Packed(p), _) => x.matmul(&p.unpack()?.to_dtype(x.dtype())?.t()?),
        (Weight::Fp8(w), Path::Autograd) => x.matmul(&w.dequantize()?.to_dtype(x.dtype())?.t()?),
        (Weight::Fp8(w), _) => peagle_kernels::fp8_linear(&x.contiguous()?, w),
        (Weight::Plain(w), _) => x.matmul(&w.t()?),
    }
}

/// SwiGLU's gating of the fused gate/up projection of `x` by `w` (the gate's rows first),
/// `bias` included: `swiglu(linear(x, w, bias))`, [rows, out / 2]. On a GPU a plain weight's
/// projection and gating are one op (`invariant_linear_swiglu`: one launch on the tensor
/// cores), to the same bits.
pub fn linear_swiglu(x: &Tensor, w: &Weight, bias: Option<&Tensor>) -> Result<Tensor> {
    if let Some(w) = inference_weight(x, w, bias) {
        return peagle_kernels::invariant_linear_swiglu(&x.contiguous()?, w, bias, MmaTiles::ByBatch);
    }
    swiglu(&linear(x, w, bias)?)
}

/// SwiGLU's gating `silu(gate) * up` of a fused projection `gate_up` [rows, 2 * width] whose
/// gate columns come first: [rows, width].
fn swiglu(gate_up: &Tensor) -> Result<Tensor> {
    if path(gate_up) != Path::Autograd {
        return peagle_kernels::swiglu(gate_up);
    }
    let width = gate_up.dim(1)? / 2;
    let gate = gate_up.narrow(1, 0, width)?;
    let up = gate_up.narrow(1, width, width)?;
    (candle_nn::ops::silu(&gate)? * up)?.contiguous()
}

/// gpt-oss's clamped SwiGLU (`peagle_kernels::clamped_swiglu`) of a fused projection whose
/// gate columns come first. CPU inference.
pub fn clamped_swiglu(gate_up: &Tensor, alpha: f32, limit: f32) -> Result<Tensor> {
    match path(gate_up) {
        Path::CpuKernel => peagle_kernels::clamped_swiglu(gate_up, alpha, limit),
        _ => bail!("the clamped SwiGLU of MoE experts runs on the CPU kernel only, for inference"),
    }
}

/// RMSNorm of each row of `x` over its last dimension, times `weight`.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let x = x.contiguous()?;
    if x.track_op() || weight.track_op() {
        return candle_nn::ops::rms_norm_slow(&x, weight, eps);
    }
    match path(&x) {
        Path::Device if x.rank() == 2 => peagle_kernels::rms_norm(&x, weight, eps),
        _ => candle_nn::ops::rms_norm(&x, weight, eps),
    }
}

/// `[rms_norm(a, wa), rms_norm(b, wb)]` side by side, [rows, 2 * width]: one launch on a GPU,
/// the two norms and their concatenation elsewhere, to the same bits.
pub fn rms_norm_pair(a: &Tensor, wa: &Tensor, b: &Tensor, wb: &Tensor, eps: f32) -> Result<Tensor> {
    let inference = !wa.track_op() && !wb.track_op() && a.rank() == 2;
    if inference && path(a) == Path::Device && path(b) == Path::Device {
        return peagle_kernels::rms_norm_pair(a, wa, b, wb, eps);
    }
    Tensor::cat(&[&rms_norm(a, wa, eps)?, &rms_norm(b, wb, eps)?], 1)
}

/// `(sum, rms_norm(sum))` of the residual add `sum = x + residual`: one pass on a GPU.
pub fn add_rms_norm(x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
    if path(x) == Path::Device && !weight.track_op() && x.rank() == 2 {
        return peagle_kernels::add_rms_norm(&x.contiguous()?, &residual.contiguous()?, weight, eps);
    }
    let sum = (x + residual)?;
    let normed = rms_norm(&sum, weight, eps)?;
    Ok((sum, normed))
}

/// Rotates `x` [rows, heads * head_dim] (rotate-halves layout) by `cos` and `sin`
/// [rows, head_dim / 2].
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
    let rows = x.dim(0)?;
    if path(x) != Path::Autograd {
        return peagle_kernels::rope(x, cos, sin, head_dim);
    }
    let x = x.reshape((1, rows, heads, head_dim))?.transpose(1, 2)?.contiguous()?;
    candle_nn::rotary_emb::rope_slow(&x, cos, sin)?
        .transpose(1, 2)?
        .reshape((rows, heads * head_dim))
}

/// Writes row `t` of the keys `k`, rotated by `rope`, and of the values `v` [tokens, width],
/// divided by the cache's scales, into the cache slot `meta` maps it to, in the two halves of
/// `cache` [2, slots, width] (see `peagle_kernels::write_rotated_kv`: one launch on a GPU).
pub fn write_kv(
    cache: &Tensor,
    k: &Tensor,
    v: &Tensor,
    meta: &AttentionMetadata,
    scale: KvScale,
    rope: Rotation,
) -> Result<()> {
    peagle_kernels::write_rotated_kv(cache, k, v, meta, scale, rope)
}

/// Causal attention of a flattened batch's queries, rotated by `rope`, over the paged cache,
/// with a sink logit per query head when given (see `peagle_kernels::rotated_paged_attention`:
/// on a GPU the kernel rotates the queries as it reads them).
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMetadata,
    params: &AttentionParams,
    sinks: Option<&Sinks>,
    rope: Rotation,
) -> Result<Tensor> {
    peagle_kernels::rotated_paged_attention(q, k_cache, v_cache, meta, params, sinks, rope)
}

/// `softmax(scores + bias)` over the last dimension, differentiable in `scores` (see
/// `peagle_kernels::masked_softmax`, which also serves other devices with composed ops).
pub fn masked_softmax(scores: &Tensor, bias: &Tensor) -> Result<Tensor> {
    peagle_kernels::masked_softmax(scores, bias)
}

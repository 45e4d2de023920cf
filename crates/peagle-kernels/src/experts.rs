//! What a mixture-of-experts block on a CUDA device is the same for whatever its experts'
//! weights (`Mxfp4Experts`: gpt-oss's MXFP4; `DenseExperts`: bf16): how rows choose and gate
//! their experts (`Routing`), the block's result before its weighted sum (`ExpertOutputs`), and
//! the experts on the device with a forward's checks and launches up to that result
//! (`DeviceExperts`). kernels/moe.cu routes, groups and combines for both.

use crate::cuda::{ExpertWeights, MAX_EXPERTS};
use crate::cuda_matmul::{CudaMatmul, MmaTiles};
use crate::error::bad_input;
use candle_core::cuda_backend::CudaDevice;
use candle_core::{DType, Device, Result, Tensor};

/// How rows choose their experts and how the experts gate.
#[derive(Debug, Clone, Copy)]
pub struct Routing {
    /// Experts per row.
    pub top_k: usize,
    /// The weights are a softmax over the chosen experts' logits; else each chosen expert's
    /// share of a softmax over all of them.
    pub normalize: bool,
    /// gpt-oss's clamped SwiGLU's `(alpha, limit)`; `None` is `silu(gate) * up`.
    pub clamp: Option<(f32, f32)>,
}

/// The widths of a block's experts, and how many there are.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ExpertShape {
    pub num_experts: usize,
    pub hidden: usize,
    pub intermediate: usize,
}

impl ExpertShape {
    /// The shape of `count` experts whose first's down projection is [H, I] (`first_down`), on
    /// `device`, which must be a CUDA device: that device, and the shape.
    pub(crate) fn on_device(
        op: &'static str,
        device: &Device,
        count: usize,
        first_down: Option<(usize, usize)>,
    ) -> Result<(CudaDevice, Self)> {
        let Device::Cuda(cuda) = device else {
            return Err(bad_input(
                op,
                "experts run on a CUDA device here; the CPU runs them one at a time",
            ));
        };
        let Some((hidden, intermediate)) = first_down else {
            return Err(bad_input(op, "no experts"));
        };
        if count > MAX_EXPERTS {
            return Err(bad_input(
                op,
                format!("{count} experts: the kernels route among at most {MAX_EXPERTS}"),
            ));
        }
        let shape = Self {
            num_experts: count,
            hidden,
            intermediate,
        };
        Ok((cuda.clone(), shape))
    }

    /// Fails unless expert `i`'s gate_up is [2I, H] and its down [H, I] (`dims`), and each bias
    /// it has (its length) covers its projection's rows.
    pub(crate) fn check_expert(
        &self,
        op: &'static str,
        i: usize,
        (gate_up, down): ((usize, usize), (usize, usize)),
        (gate_up_bias, down_bias): (Option<usize>, Option<usize>),
    ) -> Result<()> {
        let (h, inter) = (self.hidden, self.intermediate);
        let fits = |bias: Option<usize>, rows| bias.is_none_or(|len| len == rows);
        if gate_up == (2 * inter, h) && down == (h, inter) && fits(gate_up_bias, 2 * inter) && fits(down_bias, h) {
            return Ok(());
        }
        Err(bad_input(
            op,
            format!(
                "expert {i}: gate_up {gate_up:?} with a bias of {gate_up_bias:?}, down {down:?} with a bias of {down_bias:?}, not [{}, {h}] and [{h}, {inter}]",
                2 * inter
            ),
        ))
    }
}

/// A block's experts on a CUDA device: their shape, the device and their weights there.
pub(crate) struct DeviceExperts {
    pub shape: ExpertShape,
    pub device: Device,
    pub weights: ExpertWeights,
}

impl DeviceExperts {
    /// The block's result for `x` [rows, H] and the router's `logits` [rows, experts], the
    /// projections by `kernel` in `tiles`: checked, and launched where there are rows.
    pub(crate) fn outputs(
        &self,
        op: &'static str,
        x: &Tensor,
        logits: &Tensor,
        routing: &Routing,
        kernel: CudaMatmul,
        tiles: MmaTiles,
    ) -> Result<ExpertOutputs> {
        let shape = &self.shape;
        let (rows, hidden) = x.dims2()?;
        if hidden != shape.hidden || logits.dims() != [rows, shape.num_experts] {
            return Err(bad_input(
                op,
                format!(
                    "x {:?} and logits {:?} do not fit {} experts of width {}",
                    x.dims(),
                    logits.dims(),
                    shape.num_experts,
                    shape.hidden
                ),
            ));
        }
        if routing.top_k == 0 || routing.top_k > shape.num_experts {
            return Err(bad_input(
                op,
                format!("top_k {} of {} experts", routing.top_k, shape.num_experts),
            ));
        }
        if rows == 0 {
            return Ok(ExpertOutputs {
                y: crate::no_rows(hidden, DType::F32, &self.device)?,
                weights: Tensor::zeros(0, DType::F32, &self.device)?,
                pair_of: Tensor::zeros(0, DType::I32, &self.device)?,
                rows,
                top_k: routing.top_k,
                dtype: x.dtype(),
            });
        }
        let (x, logits) = (x.contiguous()?, logits.contiguous()?);
        crate::cuda::moe_experts(&x, &logits, self, routing, kernel, tiles)
    }
}

/// A mixture-of-experts block's result before its last step: each (row, rank) pair's expert
/// output and routing weight, on the device. `combine` sums each row's in rank order, as
/// the experts' `forward` does; `add_rms_norm` reads them in the residual add and norm that
/// follow the block instead, to the same bits, and so launches no sum of its own.
pub struct ExpertOutputs {
    /// [rows * top_k, H] f32, grouped by expert.
    pub(crate) y: Tensor,
    /// [rows * top_k] f32: each row's routing weights, in rank order.
    pub(crate) weights: Tensor,
    /// [rows * top_k] i32: the row of `y` of each (row, rank).
    pub(crate) pair_of: Tensor,
    pub(crate) rows: usize,
    pub(crate) top_k: usize,
    /// The rows' dtype, which the sum takes.
    pub(crate) dtype: DType,
}

impl ExpertOutputs {
    /// The block's output [rows, H] in the rows' dtype.
    pub fn combine(&self) -> Result<Tensor> {
        match self.rows {
            0 => crate::no_rows(self.y.dim(1)?, self.dtype, self.y.device()),
            _ => crate::cuda::moe_combine(self),
        }
    }

    /// `(sum, rms_norm(sum))` with `sum = combine() + residual` (`crate::add_rms_norm`), the
    /// combine read as the add reads it: one launch. No rows give the residual's no rows.
    pub fn add_rms_norm(&self, residual: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
        match self.rows {
            0 => Ok((residual.clone(), residual.clone())),
            _ => crate::cuda::experts_add_rms_norm(self, &residual.contiguous()?, weight, eps),
        }
    }
}

//! gpt-oss's experts on a CUDA device: every expert's MXFP4 weights in one device buffer per
//! tensor, in the order the kernels read best (kernels/moe.cu's `moe_lay_out`), and the whole
//! mixture-of-experts block, from the router's logits to its output, in `kernels/moe.cu`:
//! routing, grouping by expert, the projections with the MXFP4 weights dequantized in
//! registers, the biases and the SwiGLU fused, and the weighted sum. A row's result does not
//! depend on the other rows. The CPU runs its experts one at a time through
//! the linear kernels instead (peagle-models' `Moe`), which is what the GPU tests compare with.

use crate::cuda::{DeviceExperts, MAX_EXPERTS};
use crate::cuda_matmul::{CudaMatmul, MmaTiles};
use crate::error::bad_input;
use crate::mxfp4::{Mxfp4Weight, MXFP4_BLOCK};
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

/// One expert as loaded: `gate_up` [2I, H] (the I gate rows first) and its bias [2I], `down`
/// [H, I] and its bias [H].
pub struct Mxfp4Expert<'a> {
    pub gate_up: &'a Mxfp4Weight,
    pub gate_up_bias: &'a [f32],
    pub down: &'a Mxfp4Weight,
    pub down_bias: &'a [f32],
}

/// The experts of one mixture-of-experts block, on a CUDA device.
pub struct Mxfp4Experts {
    pub(crate) num_experts: usize,
    pub(crate) hidden: usize,
    pub(crate) intermediate: usize,
    device: Device,
    pub(crate) weights: DeviceExperts,
}

impl Mxfp4Experts {
    /// Copies `experts` to `device`, which must be a CUDA device.
    pub fn new(device: &Device, experts: &[Mxfp4Expert]) -> Result<Self> {
        const OP: &str = "Mxfp4Experts";
        let Device::Cuda(cuda) = device else {
            return Err(bad_input(
                OP,
                "MXFP4 experts run on a CUDA device here; the CPU runs them one at a time",
            ));
        };
        let Some(first) = experts.first() else {
            return Err(bad_input(OP, "no experts"));
        };
        let (hidden, intermediate) = first.down.dims();
        if experts.len() > MAX_EXPERTS {
            return Err(bad_input(
                OP,
                format!(
                    "{} experts: the kernels route among at most {MAX_EXPERTS}",
                    experts.len()
                ),
            ));
        }
        for (i, e) in experts.iter().enumerate() {
            if e.gate_up.dims() != (2 * intermediate, hidden)
                || e.down.dims() != (hidden, intermediate)
                || e.gate_up_bias.len() != 2 * intermediate
                || e.down_bias.len() != hidden
            {
                return Err(bad_input(
                    OP,
                    format!(
                        "expert {i}: gate_up {:?} with a bias of {}, down {:?} with a bias of {}, not [{}, {hidden}] and [{hidden}, {intermediate}]",
                        e.gate_up.dims(),
                        e.gate_up_bias.len(),
                        e.down.dims(),
                        e.down_bias.len(),
                        2 * intermediate,
                    ),
                ));
            }
        }
        let (gate_up_blocks, gate_up_scales) = crate::cuda::lay_out_experts(
            cuda,
            (
                &joined(experts, |e| e.gate_up.packed().0),
                &joined(experts, |e| e.gate_up.packed().1),
            ),
            experts.len(),
            (2 * intermediate, hidden / MXFP4_BLOCK),
        )?;
        let (down_blocks, down_scales) = crate::cuda::lay_out_experts(
            cuda,
            (
                &joined(experts, |e| e.down.packed().0),
                &joined(experts, |e| e.down.packed().1),
            ),
            experts.len(),
            (hidden, intermediate / MXFP4_BLOCK),
        )?;
        let weights = DeviceExperts {
            gate_up_blocks,
            gate_up_scales,
            gate_up_bias: cuda.clone_htod(&joined(experts, |e| e.gate_up_bias))?,
            down_blocks,
            down_scales,
            down_bias: cuda.clone_htod(&joined(experts, |e| e.down_bias))?,
        };
        Ok(Self {
            num_experts: experts.len(),
            hidden,
            intermediate,
            device: device.clone(),
            weights,
        })
    }

    /// The block's output [rows, H] for `x` [rows, H] and the router's `logits` [rows,
    /// experts], both f32 or both bf16 on the experts' device, in x's dtype. bf16 rows take
    /// the tensor cores where the process's matmul does (`CudaMatmul::chosen`).
    pub fn forward(&self, x: &Tensor, logits: &Tensor, routing: &Routing) -> Result<Tensor> {
        self.outputs(x, logits, routing)?.combine()
    }

    /// `forward` up to its last step, the weighted sum of each row's experts' outputs: for a
    /// residual add and norm to read instead (`ExpertOutputs::add_rms_norm`).
    pub fn outputs(&self, x: &Tensor, logits: &Tensor, routing: &Routing) -> Result<ExpertOutputs> {
        let kernel = CudaMatmul::for_op("moe_mxfp4")?;
        self.outputs_tiled(x, logits, routing, kernel, MmaTiles::ByBatch)
    }

    /// `forward` by the projections of `kernel`, whatever the process chose: for comparing
    /// them.
    pub fn forward_by(&self, x: &Tensor, logits: &Tensor, routing: &Routing, kernel: CudaMatmul) -> Result<Tensor> {
        self.forward_tiled(x, logits, routing, kernel, MmaTiles::ByBatch)
    }

    /// `forward_by` in the tensor cores' tiles `tiles` asks for (by the batch: wide where the
    /// average expert has more than 8 pairs): for comparing them.
    pub fn forward_tiled(
        &self,
        x: &Tensor,
        logits: &Tensor,
        routing: &Routing,
        kernel: CudaMatmul,
        tiles: MmaTiles,
    ) -> Result<Tensor> {
        self.outputs_tiled(x, logits, routing, kernel, tiles)?.combine()
    }

    fn outputs_tiled(
        &self,
        x: &Tensor,
        logits: &Tensor,
        routing: &Routing,
        kernel: CudaMatmul,
        tiles: MmaTiles,
    ) -> Result<ExpertOutputs> {
        let (rows, hidden) = x.dims2()?;
        if hidden != self.hidden || logits.dims() != [rows, self.num_experts] {
            return Err(bad_input(
                "moe_mxfp4",
                format!(
                    "x {:?} and logits {:?} do not fit {} experts of width {}",
                    x.dims(),
                    logits.dims(),
                    self.num_experts,
                    self.hidden
                ),
            ));
        }
        if routing.top_k == 0 || routing.top_k > self.num_experts {
            return Err(bad_input(
                "moe_mxfp4",
                format!("top_k {} of {} experts", routing.top_k, self.num_experts),
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
        crate::cuda::moe_experts(&x.contiguous()?, &logits.contiguous()?, self, routing, kernel, tiles)
    }
}

/// A mixture-of-experts block's result before its last step: each (row, rank) pair's expert
/// output and routing weight, on the device. `combine` sums each row's in rank order, as
/// `Mxfp4Experts::forward` does; `add_rms_norm` reads them in the residual add and norm that
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

/// One part of every expert, end to end.
fn joined<'a, T: Copy + 'a>(experts: &'a [Mxfp4Expert<'a>], part: impl Fn(&'a Mxfp4Expert<'a>) -> &'a [T]) -> Vec<T> {
    experts.iter().map(part).collect::<Vec<_>>().concat()
}

//! gpt-oss's experts on a CUDA device: every expert's MXFP4 weights in one device buffer per
//! tensor, in the order the kernels read best (`kernels/mxfp4.cuh`), and the whole
//! mixture-of-experts block, from the router's logits to its output: routing, grouping by
//! expert and the weighted sum in `kernels/moe.cu`, and the projections with the MXFP4 weights
//! dequantized in registers, the biases and the SwiGLU fused, in `kernels/moe_mxfp4_mma.cu`
//! (tensor cores) or `kernels/moe_mxfp4.cu` (CUDA cores). A row's result does not
//! depend on the other rows. The CPU runs its experts one at a time through
//! the linear kernels instead (peagle-models' `Moe`), which is what the GPU tests compare with.

use crate::cuda::{ExpertWeights, Mxfp4Buffers};
use crate::cuda_matmul::{CudaMatmul, MmaTiles};
use crate::experts::{DeviceExperts, ExpertOutputs, ExpertShape, Routing};
use crate::mxfp4::{Mxfp4Weight, MXFP4_BLOCK};
use candle_core::{Device, Result, Tensor};

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
    experts: DeviceExperts,
}

impl Mxfp4Experts {
    /// Copies `experts` to `device`, which must be a CUDA device.
    pub fn new(device: &Device, experts: &[Mxfp4Expert]) -> Result<Self> {
        const OP: &str = "Mxfp4Experts";
        let (cuda, shape) = ExpertShape::on_device(OP, device, experts.len(), experts.first().map(|e| e.down.dims()))?;
        let (hidden, intermediate) = (shape.hidden, shape.intermediate);
        for (i, e) in experts.iter().enumerate() {
            let biases = (Some(e.gate_up_bias.len()), Some(e.down_bias.len()));
            shape.check_expert(OP, i, (e.gate_up.dims(), e.down.dims()), biases)?;
        }
        let (gate_up_blocks, gate_up_scales) = crate::cuda::lay_out_experts(
            &cuda,
            (
                &joined(experts, |e| e.gate_up.packed().0),
                &joined(experts, |e| e.gate_up.packed().1),
            ),
            experts.len(),
            (2 * intermediate, hidden / MXFP4_BLOCK),
        )?;
        let (down_blocks, down_scales) = crate::cuda::lay_out_experts(
            &cuda,
            (
                &joined(experts, |e| e.down.packed().0),
                &joined(experts, |e| e.down.packed().1),
            ),
            experts.len(),
            (hidden, intermediate / MXFP4_BLOCK),
        )?;
        let weights = ExpertWeights::Mxfp4(Box::new(Mxfp4Buffers {
            gate_up_blocks,
            gate_up_scales,
            gate_up_bias: cuda.clone_htod(&joined(experts, |e| e.gate_up_bias))?,
            down_blocks,
            down_scales,
            down_bias: cuda.clone_htod(&joined(experts, |e| e.down_bias))?,
        }));
        Ok(Self {
            experts: DeviceExperts {
                shape,
                device: device.clone(),
                weights,
            },
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
        self.experts.outputs("moe_mxfp4", x, logits, routing, kernel, tiles)
    }
}

/// One part of every expert, end to end.
fn joined<'a, T: Copy + 'a>(experts: &'a [Mxfp4Expert<'a>], part: impl Fn(&'a Mxfp4Expert<'a>) -> &'a [T]) -> Vec<T> {
    experts.iter().map(part).collect::<Vec<_>>().concat()
}

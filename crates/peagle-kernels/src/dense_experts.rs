//! A mixture-of-experts block whose experts' weights are dense bf16 (Qwen3-MoE; gpt-oss from a
//! dense checkpoint) on a CUDA device: every expert's weights in one device tensor per
//! projection, and the whole block, from the router's logits to its output, on the device:
//! routing, grouping by expert and the weighted sum in `kernels/moe.cu`, as for MXFP4 experts,
//! and the projections on the tensor cores in `kernels/moe_dense.cu`, each element as a linear
//! layer computes it, then the SwiGLU. A row's result does not depend on the other rows. The
//! CPU runs its experts one at a time through the linear kernels instead (peagle-models'
//! `Moe`), which is what the GPU tests compare with.

use crate::cuda::ExpertWeights;
use crate::cuda_matmul::{CudaMatmul, MmaTiles};
use crate::error::bad_input;
use crate::experts::{DeviceExperts, ExpertOutputs, ExpertShape, Routing};
use candle_core::{DType, Device, Result, Tensor};

/// One expert as loaded, bf16: `gate_up` [2I, H] (the I gate rows first) and its bias [2I],
/// `down` [H, I] and its bias [H]; every expert of a block has biases, or none has.
pub struct DenseExpert<'a> {
    pub gate_up: &'a Tensor,
    pub gate_up_bias: Option<&'a Tensor>,
    pub down: &'a Tensor,
    pub down_bias: Option<&'a Tensor>,
}

/// The experts of one mixture-of-experts block, on a CUDA device.
pub struct DenseExperts {
    experts: DeviceExperts,
}

impl DenseExperts {
    /// Copies `experts` to `device`, which must be a CUDA device.
    pub fn new(device: &Device, experts: &[DenseExpert]) -> Result<Self> {
        const OP: &str = "DenseExperts";
        let first_down = experts.first().map(|e| e.down.dims2()).transpose()?;
        let (_, shape) = ExpertShape::on_device(OP, device, experts.len(), first_down)?;
        if !shape.hidden.is_multiple_of(32) || !shape.intermediate.is_multiple_of(32) {
            return Err(bad_input(
                OP,
                format!(
                    "widths {} and {}: the tensor cores take multiples of 32",
                    shape.hidden, shape.intermediate
                ),
            ));
        }
        for (i, e) in experts.iter().enumerate() {
            let len = |bias: Option<&Tensor>| bias.map(|b| b.elem_count());
            shape.check_expert(
                OP,
                i,
                (e.gate_up.dims2()?, e.down.dims2()?),
                (len(e.gate_up_bias), len(e.down_bias)),
            )?;
            let tensors = [Some(e.gate_up), e.gate_up_bias, Some(e.down), e.down_bias];
            if tensors.iter().flatten().any(|t| t.dtype() != DType::BF16) {
                return Err(bad_input(OP, format!("expert {i}: the tensor cores take bf16 weights")));
            }
        }
        let weights = ExpertWeights::Dense {
            gate_up: joined(experts, device, |e| e.gate_up)?,
            gate_up_bias: joined_biases(experts, device, |e| e.gate_up_bias)?,
            down: joined(experts, device, |e| e.down)?,
            down_bias: joined_biases(experts, device, |e| e.down_bias)?,
        };
        Ok(Self {
            experts: DeviceExperts {
                shape,
                device: device.clone(),
                weights,
            },
        })
    }

    /// The block's output [rows, H] for `x` [rows, H] and the router's `logits` [rows,
    /// experts], both bf16 on the experts' device.
    pub fn forward(&self, x: &Tensor, logits: &Tensor, routing: &Routing) -> Result<Tensor> {
        self.outputs(x, logits, routing)?.combine()
    }

    /// `forward` up to its last step, the weighted sum of each row's experts' outputs: for a
    /// residual add and norm to read instead (`ExpertOutputs::add_rms_norm`).
    pub fn outputs(&self, x: &Tensor, logits: &Tensor, routing: &Routing) -> Result<ExpertOutputs> {
        self.outputs_tiled(x, logits, routing, MmaTiles::ByBatch)
    }

    /// `forward` in the tiles `tiles` asks for (by the batch: wide where the average expert
    /// has more than 8 pairs): for comparing them.
    pub fn forward_tiled(&self, x: &Tensor, logits: &Tensor, routing: &Routing, tiles: MmaTiles) -> Result<Tensor> {
        self.outputs_tiled(x, logits, routing, tiles)?.combine()
    }

    fn outputs_tiled(&self, x: &Tensor, logits: &Tensor, routing: &Routing, tiles: MmaTiles) -> Result<ExpertOutputs> {
        self.experts
            .outputs("moe_dense", x, logits, routing, CudaMatmul::Mma, tiles)
    }
}

/// One part of every expert, end to end, on `device`.
fn joined<'a>(
    experts: &[DenseExpert<'a>],
    device: &Device,
    part: impl Fn(&DenseExpert<'a>) -> &'a Tensor,
) -> Result<Tensor> {
    let parts: Vec<&Tensor> = experts.iter().map(part).collect();
    Tensor::cat(&parts, 0)?.to_device(device)?.contiguous()
}

/// `joined` for a bias every expert has, or none.
fn joined_biases<'a>(
    experts: &[DenseExpert<'a>],
    device: &Device,
    part: impl Fn(&DenseExpert<'a>) -> Option<&'a Tensor>,
) -> Result<Option<Tensor>> {
    match experts.iter().filter(|e| part(e).is_some()).count() {
        0 => Ok(None),
        n if n == experts.len() => joined(experts, device, |e| part(e).expect("every expert has one")).map(Some),
        _ => Err(bad_input("DenseExperts", "some experts have biases and some have none")),
    }
}

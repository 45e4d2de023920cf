//! A mixture-of-experts block whose experts' weights are dense, bf16 or block-scaled FP8
//! (Qwen3-MoE and its FP8 checkpoints; gpt-oss from a dense checkpoint), on a CUDA device, bf16
//! rows: every expert's weights in one device tensor per projection, and the whole block, from
//! the router's logits to its output, on the device: routing, grouping by expert and the
//! weighted sum in `kernels/moe.cu`, as for MXFP4 experts, and the projections on the tensor
//! cores in `kernels/moe_dense.cu`, each element as a linear layer computes it, then the
//! SwiGLU. A row's result does not depend on the other rows. The CPU runs its experts one at a
//! time through the linear kernels instead (peagle-models' `Moe`), which is what the GPU tests
//! compare with.

use crate::cuda::ExpertWeights;
use crate::cuda_matmul::{CudaMatmul, MmaTiles};
use crate::error::bad_input;
use crate::experts::{DeviceExperts, ExpertOutputs, ExpertShape, Routing};
use crate::fp8_weight::Fp8Weight;
use candle_core::{DType, Device, Result, Tensor};

/// One expert as loaded: `gate_up` [2I, H] (the I gate rows first) and its bias [2I], `down`
/// [H, I] and its bias [H]; the biases bf16, and every expert of a block has them or none has;
/// the matrices of a block all of one kind.
pub struct DenseExpert<'a> {
    pub gate_up: ExpertMatrix<'a>,
    pub gate_up_bias: Option<&'a Tensor>,
    pub down: ExpertMatrix<'a>,
    pub down_bias: Option<&'a Tensor>,
}

/// An expert's weight: bf16, or block-scaled FP8 whose blocks the tensor cores take (a multiple
/// of 32 wide) and whose rows are whole blocks, so that the experts' scales stack.
#[derive(Clone, Copy)]
pub enum ExpertMatrix<'a> {
    Bf16(&'a Tensor),
    Fp8(&'a Fp8Weight),
}

impl<'a> ExpertMatrix<'a> {
    fn bf16(&self) -> Option<&'a Tensor> {
        match self {
            Self::Bf16(w) => Some(w),
            Self::Fp8(_) => None,
        }
    }

    fn fp8(&self) -> Option<&'a Fp8Weight> {
        match self {
            Self::Fp8(w) => Some(w),
            Self::Bf16(_) => None,
        }
    }

    fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Self::Bf16(w) => w.dims2(),
            Self::Fp8(w) => Ok(w.dims()),
        }
    }

    /// Why the kernels cannot take this matrix beside `first` (the first expert's, in its
    /// place), if they cannot.
    fn misfit(&self, first: &Self) -> Option<String> {
        match (*self, *first) {
            (Self::Bf16(w), Self::Bf16(_)) if w.dtype() != DType::BF16 => {
                Some(format!("{:?} weights: the tensor cores take bf16 or FP8", w.dtype()))
            }
            (Self::Bf16(_), Self::Bf16(_)) => None,
            (Self::Fp8(w), Self::Fp8(f)) if w.block() != f.block() => {
                Some(format!("FP8 blocks {:?} beside {:?}", w.block(), f.block()))
            }
            (Self::Fp8(w), Self::Fp8(_)) => {
                let ((rows, _), (bn, bk)) = (w.dims(), w.block());
                (!bk.is_multiple_of(32) || !rows.is_multiple_of(bn))
                    .then(|| format!("FP8 blocks {bn} x {bk} over {rows} rows: the tensor cores take whole blocks of rows, a multiple of 32 wide"))
            }
            _ => Some("bf16 weights beside FP8 ones".into()),
        }
    }
}

/// The experts' matrices of one projection, end to end, on their device.
pub(crate) enum DenseMatrix {
    Bf16(Tensor),
    Fp8(Fp8Weight),
}

/// The experts of one mixture-of-experts block, on a CUDA device.
pub struct DenseExperts {
    experts: DeviceExperts,
}

impl DenseExperts {
    /// Whether `new` takes `experts`' weights (`ExpertMatrix`): their kinds and blocks, not yet
    /// their shapes or device.
    pub fn takes(experts: &[DenseExpert]) -> bool {
        Self::misfit(experts).is_none()
    }

    /// Whether the tensor cores take experts of these widths: whole steps of 32.
    pub fn takes_widths(hidden: usize, intermediate: usize) -> bool {
        hidden.is_multiple_of(32) && intermediate.is_multiple_of(32)
    }

    /// Why `takes` is false.
    fn misfit(experts: &[DenseExpert]) -> Option<String> {
        let first = experts.first()?;
        experts.iter().enumerate().find_map(|(i, e)| {
            let biases = [e.gate_up_bias, e.down_bias].into_iter().flatten();
            if biases.into_iter().any(|b| b.dtype() != DType::BF16) {
                return Some(format!("expert {i}: the biases must be bf16"));
            }
            let why = e
                .gate_up
                .misfit(&first.gate_up)
                .or_else(|| e.down.misfit(&first.down))?;
            Some(format!("expert {i}: {why}"))
        })
    }

    /// Copies `experts` to `device`, which must be a CUDA device.
    pub fn new(device: &Device, experts: &[DenseExpert]) -> Result<Self> {
        const OP: &str = "DenseExperts";
        let first_down = experts.first().map(|e| e.down.dims()).transpose()?;
        let (_, shape) = ExpertShape::on_device(OP, device, experts.len(), first_down)?;
        if !Self::takes_widths(shape.hidden, shape.intermediate) {
            return Err(bad_input(
                OP,
                format!(
                    "widths {} and {}: the tensor cores take multiples of 32",
                    shape.hidden, shape.intermediate
                ),
            ));
        }
        if let Some(why) = Self::misfit(experts) {
            return Err(bad_input(OP, why));
        }
        for (i, e) in experts.iter().enumerate() {
            let len = |bias: Option<&Tensor>| bias.map(|b| b.elem_count());
            let dims = (e.gate_up.dims()?, e.down.dims()?);
            shape.check_expert(OP, i, dims, (len(e.gate_up_bias), len(e.down_bias)))?;
        }
        let weights = ExpertWeights::Dense {
            gate_up: stacked(experts, device, |e| e.gate_up)?,
            gate_up_bias: joined_biases(experts, device, |e| e.gate_up_bias)?,
            down: stacked(experts, device, |e| e.down)?,
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

/// One matrix of every expert, end to end, on `device` (`misfit` has found them of one kind).
fn stacked<'a>(
    experts: &[DenseExpert<'a>],
    device: &Device,
    part: impl Fn(&DenseExpert<'a>) -> ExpertMatrix<'a>,
) -> Result<DenseMatrix> {
    let parts: Vec<ExpertMatrix> = experts.iter().map(part).collect();
    if let Some(bf16) = parts.iter().map(ExpertMatrix::bf16).collect::<Option<Vec<_>>>() {
        return Ok(DenseMatrix::Bf16(
            Tensor::cat(&bf16, 0)?.to_device(device)?.contiguous()?,
        ));
    }
    let Some(fp8) = parts.iter().map(|m| m.fp8().cloned()).collect::<Option<Vec<_>>>() else {
        return Err(bad_input("DenseExperts", "bf16 weights beside FP8 ones"));
    };
    let stacked = Fp8Weight::concat(&fp8)?;
    let (weight, scales) = stacked.parts();
    let on_device = |t: &Tensor| t.to_device(device)?.contiguous();
    Ok(DenseMatrix::Fp8(Fp8Weight::new(
        on_device(weight)?,
        on_device(scales)?,
        stacked.block(),
    )?))
}

/// A bias every expert has, end to end, on `device`, or none.
fn joined_biases<'a>(
    experts: &[DenseExpert<'a>],
    device: &Device,
    part: impl Fn(&DenseExpert<'a>) -> Option<&'a Tensor>,
) -> Result<Option<Tensor>> {
    match experts.iter().filter(|e| part(e).is_some()).count() {
        0 => Ok(None),
        n if n == experts.len() => {
            let parts: Vec<&Tensor> = experts.iter().filter_map(part).collect();
            Ok(Some(Tensor::cat(&parts, 0)?.to_device(device)?.contiguous()?))
        }
        _ => Err(bad_input("DenseExperts", "some experts have biases and some have none")),
    }
}

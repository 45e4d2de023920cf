use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use candle_core::{Result, Tensor};
use peagle_kernels::PackedWeight;

/// A linear layer on the batch-invariant matmul kernel. Several HF projections that read the
/// same input (q/k/v, gate/up) are fused into one weight so the input is read once.
pub struct Linear {
    weight: Tensor,
    /// The weight in the kernel's layout, for CPU weights that training does not update.
    packed: Option<PackedWeight>,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let packed = if weight.device().is_cpu() && !weight.is_variable() {
            Some(PackedWeight::new(&weight)?)
        } else {
            None
        };
        Ok(Self { weight, packed, bias })
    }

    /// Loads `{prefix}.weight` [out, in] (and `{prefix}.bias`) for each prefix and stacks them.
    pub fn load_fused(
        ckpt: &Checkpoint,
        parts: &[(&str, usize)],
        in_dim: usize,
        bias: bool,
    ) -> std::result::Result<Self, LoadError> {
        let mut weights = Vec::with_capacity(parts.len());
        let mut biases = Vec::with_capacity(parts.len());
        for (prefix, out_dim) in parts {
            weights.push(ckpt.matrix(&format!("{prefix}.weight"), &[*out_dim, in_dim])?);
            if bias {
                biases.push(ckpt.vector(&format!("{prefix}.bias"), &[*out_dim])?);
            }
        }
        let cat = |ts: &[Tensor]| {
            Tensor::cat(ts, 0).map_err(|source| LoadError::Candle {
                context: format!("fusing {}", parts[0].0),
                source,
            })
        };
        let bias = if bias { Some(cat(&biases)?) } else { None };
        Self::new(cat(&weights)?, bias).map_err(|source| LoadError::Candle {
            context: format!("packing {}", parts[0].0),
            source,
        })
    }

    pub fn load(
        ckpt: &Checkpoint,
        prefix: &str,
        out_dim: usize,
        in_dim: usize,
        bias: bool,
    ) -> std::result::Result<Self, LoadError> {
        Self::load_fused(ckpt, &[(prefix, out_dim)], in_dim, bias)
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// `x` [rows, in] to [rows, out].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // The kernel is CPU code without a backward: other devices, and passes that track
        // gradients (training), use candle's matmul.
        let y = match &self.packed {
            Some(packed) if !x.track_op() => peagle_kernels::linear(x, packed)?,
            _ => x.matmul(&self.weight.t()?)?,
        };
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

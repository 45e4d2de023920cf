use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use candle_core::{Result, Tensor};
use peagle_kernels::PackedWeight;

/// A linear layer on the batch-invariant matmul kernel. Several HF projections that read the
/// same input (q/k/v, gate/up) are fused into one weight so the input is read once.
pub struct Linear {
    weight: Weight,
    bias: Option<Tensor>,
}

enum Weight {
    /// Weights that training updates (variables, or fused from them), and weights on other
    /// devices: candle's matmul.
    Plain(Tensor),
    /// Every other CPU weight, held only in the kernel's layout.
    Packed(PackedWeight),
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        let weight = if weight.device().is_cpu() && !weight.track_op() {
            Weight::Packed(PackedWeight::new(&weight)?)
        } else {
            Weight::Plain(weight)
        };
        Ok(Self { weight, bias })
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

    /// The weight [out, in] (unpacked from the kernel's layout on the CPU).
    pub fn weight(&self) -> Result<Tensor> {
        match &self.weight {
            Weight::Plain(w) => Ok(w.clone()),
            Weight::Packed(p) => p.unpack(),
        }
    }

    /// `x` [rows, in] to [rows, out].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // The kernel has no backward: a pass that tracks gradients through a frozen weight
        // multiplies by its unpacked copy.
        let y = match &self.weight {
            Weight::Packed(p) if !x.track_op() => peagle_kernels::linear(x, p)?,
            Weight::Packed(p) => x.matmul(&p.unpack()?.to_dtype(x.dtype())?.t()?)?,
            Weight::Plain(w) => x.matmul(&w.t()?)?,
        };
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::ops::{self, Weight};
use candle_core::{Result, Tensor};

/// A linear layer `x W^T + b`. Several HF projections that read the same input (q/k/v,
/// gate/up) are fused into one weight so the input is read once.
pub struct Linear {
    weight: Weight,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Result<Self> {
        Ok(Self::from_weight(Weight::new(weight)?, bias))
    }

    /// A layer over a weight already in its format (MXFP4 experts).
    pub fn from_weight(weight: Weight, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
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

    /// The weight [out, in] as a plain tensor.
    pub fn weight(&self) -> Result<Tensor> {
        self.weight.to_tensor()
    }

    /// `x` [rows, in] to [rows, out].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = ops::linear(x, &self.weight)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

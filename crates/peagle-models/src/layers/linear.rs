use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::ops::{self, Weight};
use candle_core::{Result, Tensor};
use peagle_kernels::Fp8Weight;

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
    /// Block-scaled FP8 weights stay FP8 when every part is FP8 and each but the last ends on
    /// a scale block; otherwise they are dequantized to the activation dtype.
    pub fn load_fused(
        ckpt: &Checkpoint,
        parts: &[(&str, usize)],
        in_dim: usize,
        bias: bool,
    ) -> std::result::Result<Self, LoadError> {
        let candle = |context: String| move |source| LoadError::Candle { context, source };
        let names: Vec<String> = parts.iter().map(|(prefix, _)| format!("{prefix}.weight")).collect();
        let mut fp8 = Vec::with_capacity(parts.len());
        for (name, (_, out_dim)) in names.iter().zip(parts) {
            fp8.push(ckpt.fp8_matrix(name, &[*out_dim, in_dim])?);
        }
        let stacked_fp8 = match fp8.iter().all(Option::is_some) {
            true => Fp8Weight::concat(&fp8.iter().flatten().cloned().collect::<Vec<_>>()).ok(),
            false => None,
        };
        let weight = match stacked_fp8 {
            Some(w) => Weight::Fp8(w),
            None => {
                let mut weights = Vec::with_capacity(parts.len());
                for ((name, (_, out_dim)), fp8) in names.iter().zip(parts).zip(fp8) {
                    weights.push(match fp8 {
                        Some(w) => w
                            .dequantize()
                            .and_then(|t| t.to_dtype(ckpt.dtype()))
                            .map_err(candle(format!("dequantizing {name}")))?,
                        None => ckpt.matrix(name, &[*out_dim, in_dim])?,
                    });
                }
                let fused = Tensor::cat(&weights, 0).map_err(candle(format!("fusing {}", parts[0].0)))?;
                Weight::new(fused).map_err(candle(format!("packing {}", parts[0].0)))?
            }
        };
        let bias = match bias {
            true => {
                let mut biases = Vec::with_capacity(parts.len());
                for (prefix, out_dim) in parts {
                    biases.push(ckpt.vector(&format!("{prefix}.bias"), &[*out_dim])?);
                }
                Some(Tensor::cat(&biases, 0).map_err(candle(format!("fusing {}", parts[0].0)))?)
            }
            false => None,
        };
        Ok(Self::from_weight(weight, bias))
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

    /// The weight as it is held.
    pub fn stored_weight(&self) -> &Weight {
        &self.weight
    }

    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// `x` [rows, in] to [rows, out].
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::linear(x, &self.weight, self.bias.as_ref())
    }

    /// SwiGLU's gating of this fused gate/up projection (the gate's rows first) of `x`:
    /// [rows, out / 2] (`ops::linear_swiglu`).
    pub fn forward_swiglu(&self, x: &Tensor) -> Result<Tensor> {
        ops::linear_swiglu(x, &self.weight, self.bias.as_ref())
    }
}

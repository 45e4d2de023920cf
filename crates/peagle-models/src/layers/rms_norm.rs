use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::ops;
use candle_core::{Result, Tensor};

/// RMSNorm over the last dimension; each row is reduced on its own, so it is batch-invariant.
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn load(ckpt: &Checkpoint, name: &str, dim: usize, eps: f64) -> std::result::Result<Self, LoadError> {
        Ok(Self {
            weight: ckpt.vector(&format!("{name}.weight"), &[dim])?,
            eps: eps as f32,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::rms_norm(x, &self.weight, self.eps)
    }

    /// `[self(a), other(b)]` side by side, [rows, 2 * width]: one launch on a GPU where the two
    /// norms share their epsilon.
    pub fn forward_pair(&self, a: &Tensor, other: &RmsNorm, b: &Tensor) -> Result<Tensor> {
        if self.eps != other.eps {
            return Tensor::cat(&[&self.forward(a)?, &other.forward(b)?], 1);
        }
        ops::rms_norm_pair(a, &self.weight, b, &other.weight, self.eps)
    }

    /// The residual add `sum = x + residual` and the norm of the sum: `(sum, normed)`.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<(Tensor, Tensor)> {
        ops::add_rms_norm(x, residual, &self.weight, self.eps)
    }

    /// `forward_residual` with x the experts' combined output, combined as it is added.
    #[cfg(feature = "cuda")]
    pub fn forward_experts(
        &self,
        experts: &peagle_kernels::ExpertOutputs,
        residual: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        experts.add_rms_norm(residual, &self.weight, self.eps)
    }
}

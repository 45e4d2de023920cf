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
}

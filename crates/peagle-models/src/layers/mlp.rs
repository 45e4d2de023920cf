use super::Linear;
use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use candle_core::{Result, Tensor};

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`, gate and up fused.
pub struct Mlp {
    gate_up: Linear,
    down: Linear,
}

impl Mlp {
    pub fn load(
        ckpt: &Checkpoint,
        prefix: &str,
        hidden: usize,
        intermediate: usize,
    ) -> std::result::Result<Self, LoadError> {
        let gate = format!("{prefix}.gate_proj");
        let up = format!("{prefix}.up_proj");
        Ok(Self {
            gate_up: Linear::load_fused(ckpt, &[(&gate, intermediate), (&up, intermediate)], hidden, false)?,
            down: Linear::load(ckpt, &format!("{prefix}.down_proj"), hidden, intermediate, false)?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.down.forward(&self.gate_up.forward_swiglu(x)?)
    }
}

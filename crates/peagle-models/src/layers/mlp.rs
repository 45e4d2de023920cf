use super::Linear;
use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use candle_core::{Result, Tensor};

/// SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`, gate and up fused.
pub struct Mlp {
    gate_up: Linear,
    down: Linear,
    intermediate: usize,
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
            intermediate,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate_up = self.gate_up.forward(x)?;
        // The fused kernel is CPU code without a backward.
        let act = if gate_up.device().is_cpu() && !gate_up.track_op() {
            peagle_kernels::swiglu(&gate_up)?
        } else {
            let gate = gate_up.narrow(1, 0, self.intermediate)?;
            let up = gate_up.narrow(1, self.intermediate, self.intermediate)?;
            (candle_nn::ops::silu(&gate)? * up)?.contiguous()?
        };
        self.down.forward(&act)
    }
}

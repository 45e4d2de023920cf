use super::{Delta, Mlp, Moe};
use crate::checkpoint::Checkpoint;
use crate::config::TextConfig;
use crate::error::LoadError;
use candle_core::{Result, Tensor};

/// A decoder layer's feed-forward block; an architecture chooses the kind per layer.
pub enum FeedForward {
    /// One SwiGLU MLP for every token.
    Dense(Mlp),
    /// Experts chosen per token by a router (gpt-oss).
    Moe(Moe),
}

impl FeedForward {
    /// A dense MLP of the config's intermediate size under `prefix`.
    pub fn load_dense(ckpt: &Checkpoint, prefix: &str, cfg: &TextConfig) -> std::result::Result<Self, LoadError> {
        Ok(Self::Dense(Mlp::load(
            ckpt,
            prefix,
            cfg.hidden_size,
            cfg.intermediate_size,
        )?))
    }

    /// Whether the forward reads values back to the host (`TargetModel::reads_back`).
    pub fn reads_back(&self) -> bool {
        matches!(self, Self::Moe(moe) if moe.routes_on_host())
    }

    /// `x` [rows, hidden] to [rows, hidden], for the residual stream to add.
    pub fn forward(&self, x: &Tensor) -> Result<Delta> {
        match self {
            Self::Dense(mlp) => Ok(Delta::Rows(mlp.forward(x)?)),
            Self::Moe(moe) => moe.forward(x),
        }
    }
}

use super::{Attention, AttentionContext, AttentionOptions, Mlp, RmsNorm, RopeTables};
use crate::checkpoint::Checkpoint;
use crate::config::TextConfig;
use crate::error::LoadError;
use candle_core::{Result, Tensor};

/// Pre-norm transformer block: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
pub struct DecoderLayer {
    input_norm: RmsNorm,
    attn: Attention,
    post_attention_norm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    pub fn load(
        ckpt: &Checkpoint,
        prefix: &str,
        cfg: &TextConfig,
        opts: AttentionOptions,
    ) -> std::result::Result<Self, LoadError> {
        let norm = |name: &str| RmsNorm::load(ckpt, &format!("{prefix}.{name}"), cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            input_norm: norm("input_layernorm")?,
            attn: Attention::load(ckpt, &format!("{prefix}.self_attn"), cfg, cfg.hidden_size, opts)?,
            post_attention_norm: norm("post_attention_layernorm")?,
            mlp: Mlp::load(ckpt, &format!("{prefix}.mlp"), cfg.hidden_size, cfg.intermediate_size)?,
        })
    }

    pub fn forward(&self, x: &Tensor, rope: &RopeTables, ctx: &AttentionContext) -> Result<Tensor> {
        let x = (x + self.attn.forward(&self.input_norm.forward(x)?, rope, ctx)?)?;
        &x + self.mlp.forward(&self.post_attention_norm.forward(&x)?)?
    }
}

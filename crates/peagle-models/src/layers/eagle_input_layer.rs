use super::{Attention, AttentionContext, AttentionOptions, FeedForward, Residual, RmsNorm, RopeTables};
use crate::checkpoint::Checkpoint;
use crate::config::TextConfig;
use crate::error::LoadError;
use candle_core::{Result, Tensor};

/// An EAGLE drafter's first layer: attention reads `[input_norm(embedding) ; hidden_norm(h)]`
/// (2H wide) and the residual stream starts from the hidden input `h` alone.
pub struct EagleInputLayer {
    input_norm: RmsNorm,
    hidden_norm: RmsNorm,
    attn: Attention,
    post_attention_norm: RmsNorm,
    ffn: FeedForward,
    /// Start the residual from `hidden_norm(h)` instead of `h`.
    norm_before_residual: bool,
}

impl EagleInputLayer {
    pub fn load(
        ckpt: &Checkpoint,
        prefix: &str,
        cfg: &TextConfig,
        opts: AttentionOptions,
        norm_before_residual: bool,
    ) -> std::result::Result<Self, LoadError> {
        let h = cfg.hidden_size;
        let norm = |name: &str| RmsNorm::load(ckpt, &format!("{prefix}.{name}"), h, cfg.rms_norm_eps);
        Ok(Self {
            input_norm: norm("input_layernorm")?,
            hidden_norm: norm("hidden_norm")?,
            attn: Attention::load(ckpt, &format!("{prefix}.self_attn"), cfg, 2 * h, opts)?,
            post_attention_norm: norm("post_attention_layernorm")?,
            ffn: FeedForward::load_dense(ckpt, &format!("{prefix}.mlp"), cfg)?,
            norm_before_residual,
        })
    }

    pub fn forward(
        &self,
        embeds: &Tensor,
        hidden: &Tensor,
        rope: &RopeTables,
        ctx: &AttentionContext,
    ) -> Result<Residual> {
        let input = self.input_norm.forward_pair(embeds, &self.hidden_norm, hidden)?;
        let residual = match self.norm_before_residual {
            true => input.narrow(1, hidden.dim(1)?, hidden.dim(1)?)?,
            false => hidden.clone(),
        };
        let attn = self.attn.forward(&input, rope, ctx)?;
        let (x, normed) = self.post_attention_norm.forward_residual(&residual, &attn)?;
        Ok(Residual::pending(x, self.ffn.forward(&normed)?))
    }
}

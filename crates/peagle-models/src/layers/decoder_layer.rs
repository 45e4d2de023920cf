use super::{Attention, AttentionContext, AttentionOptions, FeedForward, Residual, RmsNorm, RopeTables};
use crate::checkpoint::Checkpoint;
use crate::config::TextConfig;
use crate::error::LoadError;
use candle_core::{Result, Tensor};

/// Pre-norm transformer block: `x + attn(norm(x))`, then `x + ffn(norm(x))`. The architecture
/// chooses the attention options and the feed-forward kind of each layer.
pub struct DecoderLayer {
    input_norm: RmsNorm,
    attn: Attention,
    post_attention_norm: RmsNorm,
    ffn: FeedForward,
}

impl DecoderLayer {
    /// Loads the norms and attention of the Hugging Face layout under `prefix`
    /// (`input_layernorm`, `self_attn`, `post_attention_layernorm`) around `ffn`.
    pub fn load(
        ckpt: &Checkpoint,
        prefix: &str,
        cfg: &TextConfig,
        opts: AttentionOptions,
        ffn: FeedForward,
    ) -> std::result::Result<Self, LoadError> {
        let norm = |name: &str| RmsNorm::load(ckpt, &format!("{prefix}.{name}"), cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            input_norm: norm("input_layernorm")?,
            attn: Attention::load(ckpt, &format!("{prefix}.self_attn"), cfg, cfg.hidden_size, opts)?,
            post_attention_norm: norm("post_attention_layernorm")?,
            ffn,
        })
    }

    /// A layer with a dense SwiGLU MLP (`{prefix}.mlp`), as Llama and the drafters have.
    pub fn load_dense(
        ckpt: &Checkpoint,
        prefix: &str,
        cfg: &TextConfig,
        opts: AttentionOptions,
    ) -> std::result::Result<Self, LoadError> {
        let ffn = FeedForward::load_dense(ckpt, &format!("{prefix}.mlp"), cfg)?;
        Self::load(ckpt, prefix, cfg, opts, ffn)
    }

    /// Whether the forward reads values back to the host (`TargetModel::reads_back`).
    pub fn reads_back(&self) -> bool {
        self.ffn.reads_back()
    }

    /// The block over the stream `x`: its input (the stream's value, for a capture) and its
    /// output, whose feed-forward add is left pending for the next block.
    pub fn forward(&self, x: Residual, rope: &RopeTables, ctx: &AttentionContext) -> Result<(Tensor, Residual)> {
        let (input, normed) = x.normed(&self.input_norm)?;
        let attn = self.attn.forward(&normed, rope, ctx)?;
        let (x, normed) = self.post_attention_norm.forward_residual(&input, &attn)?;
        let delta = self.ffn.forward(&normed)?;
        Ok((input, Residual::pending(x, delta)))
    }
}

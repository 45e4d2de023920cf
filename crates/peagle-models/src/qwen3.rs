//! `Qwen3ForCausalLM`: the Llama layout plus a per-head RMSNorm of q and k before RoPE.

use crate::checkpoint::Checkpoint;
use crate::config::TextConfig;
use crate::error::LoadError;
use crate::layers::AttentionOptions;
use crate::llama::Llama;
use crate::target_model::TargetModel;

pub(crate) fn load(cfg: &TextConfig, ckpt: &Checkpoint) -> Result<Box<dyn TargetModel>, LoadError> {
    let opts = AttentionOptions {
        qk_norm: true,
        bias: cfg.attention_bias,
        ..AttentionOptions::default()
    };
    Ok(Box::new(Llama::load(cfg, ckpt, opts)?))
}

//! `Qwen3ForCausalLM`: Llama's layout plus a per-head RMSNorm on q and k before RoPE.

use crate::checkpoint::Checkpoint;
use crate::config::TextConfig;
use crate::error::LoadError;
use crate::layers::AttentionOptions;
use crate::transformer::CausalLm;

pub(crate) fn load(cfg: &TextConfig, ckpt: &Checkpoint) -> Result<CausalLm, LoadError> {
    let opts = AttentionOptions {
        qk_norm: true,
        bias: cfg.attention_bias,
    };
    CausalLm::load(cfg, ckpt, opts)
}

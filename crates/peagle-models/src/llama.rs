//! `LlamaForCausalLM`: Llama 2 and 3 (including llama3 rope scaling), and the many models that
//! share its layout.

use crate::checkpoint::Checkpoint;
use crate::config::TextConfig;
use crate::error::LoadError;
use crate::layers::AttentionOptions;
use crate::transformer::CausalLm;

pub(crate) fn load(cfg: &TextConfig, ckpt: &Checkpoint) -> Result<CausalLm, LoadError> {
    let opts = AttentionOptions {
        qk_norm: false,
        bias: cfg.attention_bias,
    };
    CausalLm::load(cfg, ckpt, opts)
}

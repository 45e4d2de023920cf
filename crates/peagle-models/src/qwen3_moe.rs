//! `Qwen3MoeForCausalLM` (Qwen3-Coder-30B-A3B and its kin): Qwen3's attention (a per-head
//! RMSNorm of q and k) with a mixture of experts as the feed-forward of the sparse layers.
//! Routing is a softmax over all experts, the `top_k` best, renormalised over those when
//! `norm_topk_prob`; experts are plain SwiGLU MLPs without biases and there is no shared
//! expert. Layers in `mlp_only_layers`, or off the `decoder_sparse_step` grid, are dense.

use crate::checkpoint::Checkpoint;
use crate::config::{read_json, TextConfig};
use crate::error::LoadError;
use crate::layers::{Activation, AttentionOptions, DecoderLayer, FeedForward, Moe, MoeConfig};
use crate::llama::Llama;
use crate::target_model::TargetModel;
use serde::Deserialize;

/// The fields of a Qwen3-MoE config.json beyond `TextConfig`'s; defaults are transformers'.
#[derive(Debug, Deserialize)]
struct Qwen3MoeConfig {
    num_experts: usize,
    num_experts_per_tok: usize,
    moe_intermediate_size: usize,
    #[serde(default)]
    norm_topk_prob: bool,
    #[serde(default = "one")]
    decoder_sparse_step: usize,
    #[serde(default)]
    mlp_only_layers: Vec<usize>,
}

fn one() -> usize {
    1
}

impl Qwen3MoeConfig {
    fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

pub(crate) fn load(cfg: &TextConfig, ckpt: &Checkpoint) -> Result<Box<dyn TargetModel>, LoadError> {
    let extra: Qwen3MoeConfig =
        serde_json::from_value(read_json(&cfg.path, "model config")?).map_err(|source| LoadError::Json {
            path: cfg.path.clone(),
            source,
        })?;
    if extra.decoder_sparse_step == 0 {
        return Err(cfg.invalid("decoder_sparse_step must be at least 1".into()));
    }
    if extra.num_experts > 0 && (extra.num_experts_per_tok == 0 || extra.num_experts_per_tok > extra.num_experts) {
        return Err(cfg.invalid(format!(
            "num_experts_per_tok {} must be between 1 and num_experts {}",
            extra.num_experts_per_tok, extra.num_experts
        )));
    }
    let moe = MoeConfig {
        num_experts: extra.num_experts,
        top_k: extra.num_experts_per_tok,
        hidden: cfg.hidden_size,
        intermediate: extra.moe_intermediate_size,
        normalize_top_k: extra.norm_topk_prob,
        activation: Activation::Swiglu,
        mxfp4: false,
    };
    let opts = AttentionOptions {
        qk_norm: true,
        bias: cfg.attention_bias,
        ..AttentionOptions::default()
    };
    let model = Llama::load_with_layers(cfg, ckpt, |i, prefix| {
        let mlp = format!("{prefix}.mlp");
        let ffn = match extra.is_sparse(i) {
            true => FeedForward::Moe(Moe::load_qwen3_moe(ckpt, &mlp, moe)?),
            false => FeedForward::load_dense(ckpt, &mlp, cfg)?,
        };
        DecoderLayer::load(ckpt, prefix, cfg, opts, ffn)
    })?;
    Ok(Box::new(model))
}

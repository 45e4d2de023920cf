//! `GptOssForCausalLM`: OpenAI's gpt-oss. The Llama shell (embedding, final RMSNorm, untied LM
//! head) around blocks whose attention has biases on every projection and a sink logit per
//! head, with a sliding window on the layers `layer_types` marks (alternate ones), and whose
//! feed-forward is a mixture of experts (`layers::Moe`) stored dense or in MXFP4. Its RoPE is
//! YaRN, read from the config as any scaling is.

use crate::checkpoint::Checkpoint;
use crate::config::{read_json, TextConfig};
use crate::error::LoadError;
use crate::layers::{dense_on_device, Activation, AttentionOptions, DecoderLayer, FeedForward, Moe, MoeConfig};
use crate::llama::Llama;
use crate::target_model::TargetModel;
use serde::Deserialize;

/// The fields of a gpt-oss config.json beyond `TextConfig`'s.
#[derive(Debug, Deserialize)]
struct GptOssConfig {
    num_local_experts: usize,
    num_experts_per_tok: usize,
    #[serde(default)]
    sliding_window: Option<usize>,
    #[serde(default)]
    layer_types: Option<Vec<String>>,
    #[serde(default = "default_alpha")]
    swiglu_alpha: f32,
    #[serde(default = "default_limit")]
    swiglu_limit: f32,
    #[serde(default)]
    quantization_config: Option<QuantizationConfig>,
}

#[derive(Debug, Deserialize)]
struct QuantizationConfig {
    quant_method: String,
}

fn default_alpha() -> f32 {
    1.702
}

fn default_limit() -> f32 {
    7.0
}

pub(crate) fn load(cfg: &TextConfig, ckpt: &Checkpoint) -> Result<Box<dyn TargetModel>, LoadError> {
    let extra: GptOssConfig =
        serde_json::from_value(read_json(&cfg.path, "model config")?).map_err(|source| LoadError::Json {
            path: cfg.path.clone(),
            source,
        })?;
    let windows = layer_windows(cfg, &extra)?;
    if extra.num_experts_per_tok == 0 || extra.num_experts_per_tok > extra.num_local_experts {
        return Err(cfg.invalid(format!(
            "num_experts_per_tok {} must be between 1 and num_local_experts {}",
            extra.num_experts_per_tok, extra.num_local_experts
        )));
    }
    let mxfp4 = match &extra.quantization_config {
        None => false,
        Some(q) if q.quant_method == "mxfp4" => true,
        Some(q) => return Err(cfg.invalid(format!("unsupported quantization {:?}", q.quant_method))),
    };
    let moe = MoeConfig {
        num_experts: extra.num_local_experts,
        top_k: extra.num_experts_per_tok,
        hidden: cfg.hidden_size,
        intermediate: cfg.intermediate_size,
        normalize_top_k: true,
        activation: Activation::ClampedSwiglu {
            alpha: extra.swiglu_alpha,
            limit: extra.swiglu_limit,
        },
        mxfp4,
    };
    if !mxfp4 && !ckpt.device().is_cpu() && !dense_on_device(ckpt, &moe) {
        return Err(cfg.invalid(
            "gpt-oss's dense experts run on a GPU in bf16 on the tensor cores only (or from its MXFP4 checkpoint)"
                .into(),
        ));
    }
    if mxfp4
        && (!cfg.hidden_size.is_multiple_of(peagle_kernels::MXFP4_BLOCK)
            || !cfg.intermediate_size.is_multiple_of(peagle_kernels::MXFP4_BLOCK))
    {
        return Err(cfg.invalid("MXFP4 experts need hidden and intermediate sizes in whole blocks of 32".into()));
    }
    let model = Llama::load_with_layers(cfg, ckpt, |i, prefix| {
        let opts = AttentionOptions {
            bias: true,
            sinks: true,
            sliding_window: windows[i],
            qk_norm: false,
        };
        let ffn = FeedForward::Moe(Moe::load_gpt_oss(ckpt, &format!("{prefix}.mlp"), moe)?);
        DecoderLayer::load(ckpt, prefix, cfg, opts, ffn)
    })?;
    Ok(Box::new(model))
}

/// Each layer's sliding window: `sliding_window` on the `sliding_attention` layers, none on
/// the `full_attention` ones. Without `layer_types`, even layers slide (transformers' default).
fn layer_windows(cfg: &TextConfig, extra: &GptOssConfig) -> Result<Vec<Option<usize>>, LoadError> {
    let types = extra.layer_types.clone().unwrap_or_else(|| {
        (0..cfg.num_hidden_layers)
            .map(|i| {
                if i % 2 == 0 {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
                .to_string()
            })
            .collect()
    });
    if types.len() != cfg.num_hidden_layers {
        return Err(cfg.invalid(format!(
            "{} layer_types for {} layers",
            types.len(),
            cfg.num_hidden_layers
        )));
    }
    types
        .iter()
        .map(|t| match (t.as_str(), extra.sliding_window) {
            ("full_attention", _) => Ok(None),
            ("sliding_attention", Some(w)) if w > 0 => Ok(Some(w)),
            ("sliding_attention", _) => {
                Err(cfg.invalid("sliding_attention layers need a sliding_window above 0".into()))
            }
            (other, _) => Err(cfg.invalid(format!("unknown layer type {other:?}"))),
        })
        .collect()
}

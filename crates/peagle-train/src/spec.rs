//! What drafter is being trained: its speculators-format config (the same JSON `export`
//! writes, so training and serving read one description) and its initial weights.

use crate::error::TrainError;
use crate::vocab::DraftVocab;
use candle_core::{DType, Tensor};
use peagle_models::{CausalLm, DrafterConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Algo {
    /// One pass drafts all K tokens (mask token + shared hidden state).
    Peagle,
    /// One pass per drafted token, the baseline.
    Eagle3,
}

impl Algo {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Algo::Peagle => "peagle",
            Algo::Eagle3 => "eagle3",
        }
    }
}

pub struct DrafterSpec {
    pub algo: Algo,
    pub num_layers: usize,
    pub vocab: DraftVocab,
    pub mask_token_id: Option<u32>,
    pub aux_layer_ids: Vec<usize>,
    /// Default speculation depth written into the config.
    pub num_speculative_tokens: usize,
    pub target_dir: PathBuf,
    /// The target's config.json, whose shape and rope the drafter layers copy.
    pub target_config: Value,
}

/// Target config keys a drafter layer inherits.
const LAYER_KEYS: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "max_position_embeddings",
];

impl DrafterSpec {
    fn target_usize(&self, key: &str) -> Result<usize, TrainError> {
        self.target_config[key]
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| TrainError::Invalid(format!("the target config has no `{key}`")))
    }

    /// config.json in the speculators format, with the fields vLLM reads.
    pub fn config_json(&self) -> Result<Value, TrainError> {
        let mut layer = Map::new();
        layer.insert("model_type".into(), json!("llama"));
        for key in LAYER_KEYS {
            if let Some(v) = self.target_config.get(*key).filter(|v| !v.is_null()) {
                layer.insert((*key).into(), v.clone());
            }
        }
        layer.insert("num_hidden_layers".into(), json!(self.num_layers));
        layer.insert("attention_bias".into(), json!(false));
        layer.insert("mlp_bias".into(), json!(false));
        let hidden = self.target_usize("hidden_size")?;
        let mut config = json!({
            "architectures": [match self.algo { Algo::Peagle => "PEagleSpeculator", Algo::Eagle3 => "Eagle3Speculator" }],
            "speculators_model_type": self.algo.name(),
            "speculators_version": "0.4.0",
            "draft_vocab_size": self.vocab.len(),
            // P-EAGLE starts the residual from fc's output; speculators' EAGLE-3 from the normed one.
            "norm_before_residual": self.algo == Algo::Eagle3,
            "target_hidden_size": hidden,
            "eagle_aux_hidden_state_layer_ids": self.aux_layer_ids,
            "transformer_layer_config": layer,
            "speculators_config": {
                "algorithm": self.algo.name(),
                "proposal_methods": [{
                    "proposal_type": "greedy",
                    "speculative_tokens": self.num_speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0
                }],
                "default_proposal_method": "greedy",
                "verifier": {
                    "name_or_path": self.target_dir,
                    "architectures": self.target_config["architectures"].clone()
                }
            }
        });
        if let Some(mask) = self.mask_token_id {
            config["mask_token_id"] = json!(mask);
        }
        Ok(config)
    }

    pub fn drafter_config(&self, path: &Path) -> Result<DrafterConfig, TrainError> {
        Ok(DrafterConfig::from_value(&self.config_json()?, path)?)
    }

    /// Initial weights, f32 on the target's device: random layers (normal, std
    /// `initializer_range`), unit norms, the target's embedding table and its lm_head rows of
    /// the draft vocabulary, so training starts from the target's own output layer.
    pub fn init_weights(&self, target: &CausalLm, seed: u64) -> Result<BTreeMap<String, Tensor>, TrainError> {
        let h = self.target_usize("hidden_size")?;
        let inter = self.target_usize("intermediate_size")?;
        let heads = self.target_usize("num_attention_heads")?;
        let kv_heads = self.target_usize("num_key_value_heads").unwrap_or(heads);
        let head_dim = self.target_usize("head_dim").unwrap_or(h / heads);
        let std = self.target_config["initializer_range"].as_f64().unwrap_or(0.02);
        let aux = self.aux_layer_ids.len() * h;
        let mut rng = StdRng::seed_from_u64(seed);
        let mut normal = |rows: usize, cols: usize| -> Result<Tensor, TrainError> {
            let values: Vec<f32> = (0..rows * cols).map(|_| gaussian(&mut rng) * std as f32).collect();
            Ok(Tensor::from_vec(values, (rows, cols), target.device())?)
        };
        let mut w = BTreeMap::new();
        w.insert("fc.weight".to_owned(), normal(h, aux)?);
        for i in 0..self.num_layers {
            let p = format!("layers.{i}");
            let in_dim = if i == 0 { 2 * h } else { h };
            w.insert(
                format!("{p}.self_attn.q_proj.weight"),
                normal(heads * head_dim, in_dim)?,
            );
            w.insert(
                format!("{p}.self_attn.k_proj.weight"),
                normal(kv_heads * head_dim, in_dim)?,
            );
            w.insert(
                format!("{p}.self_attn.v_proj.weight"),
                normal(kv_heads * head_dim, in_dim)?,
            );
            w.insert(format!("{p}.self_attn.o_proj.weight"), normal(h, heads * head_dim)?);
            w.insert(format!("{p}.mlp.gate_proj.weight"), normal(inter, h)?);
            w.insert(format!("{p}.mlp.up_proj.weight"), normal(inter, h)?);
            w.insert(format!("{p}.mlp.down_proj.weight"), normal(h, inter)?);
        }
        if self.algo == Algo::Peagle {
            // Stored [1, 1, width], as speculators publishes it.
            w.insert("mask_hidden".into(), normal(1, aux)?.reshape((1, 1, aux))?);
        }
        let ones = || Tensor::ones(h, DType::F32, target.device());
        for i in 0..self.num_layers {
            w.insert(format!("layers.{i}.input_layernorm.weight"), ones()?);
            w.insert(format!("layers.{i}.post_attention_layernorm.weight"), ones()?);
        }
        w.insert("layers.0.hidden_norm.weight".into(), ones()?);
        w.insert("norm.weight".into(), ones()?);
        w.insert(
            "embed_tokens.weight".into(),
            target.embedding().table().to_dtype(DType::F32)?.copy()?,
        );
        let rows = Tensor::from_slice(&self.vocab.selected, self.vocab.len(), target.device())?;
        w.insert(
            "lm_head.weight".into(),
            target.lm_head_weight()?.index_select(&rows, 0)?.to_dtype(DType::F32)?,
        );
        Ok(w)
    }
}

/// A standard normal draw (Box-Muller), so initialisation depends on the seed alone.
fn gaussian(rng: &mut StdRng) -> f32 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

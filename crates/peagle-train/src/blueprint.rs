//! What drafter is being trained: its speculators-format config (the same JSON `export`
//! writes, so training and serving read one description) and its initial weights.

use crate::error::TrainError;
use crate::vocab::DraftVocab;
use candle_core::{DType, Tensor};
use peagle_models::{DrafterConfig, TargetModel};
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

pub struct DrafterBlueprint {
    pub algo: Algo,
    pub num_layers: usize,
    pub vocab: DraftVocab,
    pub mask_token_id: Option<u32>,
    pub aux_layer_ids: Vec<usize>,
    /// Default speculation depth written into the config.
    pub num_speculative_tokens: usize,
    /// Whether layer 0's residual starts from the normed fc output rather than the raw one.
    pub norm_before_residual: bool,
    pub target_dir: PathBuf,
    /// The target's config.json, whose shape and rope the drafter layers copy.
    pub target_config: Value,
}

/// Layer 0 of a new drafter starts its residual from the normed fc output. The raw output is
/// speculators' default for P-EAGLE, but with it the demo's P-EAGLE drafter learned depth 0
/// markedly slower: 300 CPU steps on the same 800 captured samples reached 0.42 accuracy raw
/// against 0.49 normed (4 layers, 8 depths, COD ratio 0.7 with floor 0.2).
pub const NEW_DRAFTER_NORM_BEFORE_RESIDUAL: bool = true;

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

impl DrafterBlueprint {
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
            "norm_before_residual": self.norm_before_residual,
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
    pub fn init_weights(&self, target: &dyn TargetModel, seed: u64) -> Result<BTreeMap<String, Tensor>, TrainError> {
        let std = self.target_config["initializer_range"].as_f64().unwrap_or(0.02) as f32;
        let mut rng = StdRng::seed_from_u64(seed);
        let device = target.device();
        let mut w = BTreeMap::new();
        for (name, shape, init) in self.weight_plan()? {
            let weight = match init {
                Init::Normal => {
                    let values = (0..shape.iter().product()).map(|_| gaussian(&mut rng) * std).collect();
                    Tensor::from_vec(values, shape, device)?
                }
                Init::Ones => Tensor::ones(shape, DType::F32, device)?,
                Init::TargetEmbedding => target.embedding().table().to_dtype(DType::F32)?.copy()?,
                Init::TargetLmHead => {
                    let rows = Tensor::from_slice(&self.vocab.selected, self.vocab.len(), device)?;
                    target.lm_head_weight()?.index_select(&rows, 0)?.to_dtype(DType::F32)?
                }
            };
            w.insert(name, weight);
        }
        Ok(w)
    }

    /// The name and shape of every weight, without making any: what a drafter this run
    /// continues from must hold.
    pub fn weight_shapes(&self) -> Result<BTreeMap<String, Vec<usize>>, TrainError> {
        Ok(self
            .weight_plan()?
            .into_iter()
            .map(|(name, shape, _)| (name, shape))
            .collect())
    }

    /// Every weight with its shape and how a fresh run fills it, in the order of the random
    /// draws (a seed gives the same weights it always gave).
    fn weight_plan(&self) -> Result<Vec<(String, Vec<usize>, Init)>, TrainError> {
        let h = self.target_usize("hidden_size")?;
        let inter = self.target_usize("intermediate_size")?;
        let heads = self.target_usize("num_attention_heads")?;
        let kv_heads = self.target_usize("num_key_value_heads").unwrap_or(heads);
        let head_dim = self.target_usize("head_dim").unwrap_or(h / heads);
        let aux = self.aux_layer_ids.len() * h;
        let mut plan = vec![("fc.weight".to_owned(), vec![h, aux], Init::Normal)];
        for i in 0..self.num_layers {
            let p = format!("layers.{i}");
            let in_dim = if i == 0 { 2 * h } else { h };
            for (name, shape) in [
                ("self_attn.q_proj", [heads * head_dim, in_dim]),
                ("self_attn.k_proj", [kv_heads * head_dim, in_dim]),
                ("self_attn.v_proj", [kv_heads * head_dim, in_dim]),
                ("self_attn.o_proj", [h, heads * head_dim]),
                ("mlp.gate_proj", [inter, h]),
                ("mlp.up_proj", [inter, h]),
                ("mlp.down_proj", [h, inter]),
            ] {
                plan.push((format!("{p}.{name}.weight"), shape.to_vec(), Init::Normal));
            }
        }
        if self.algo == Algo::Peagle {
            // Stored [1, 1, width], as speculators publishes it.
            plan.push(("mask_hidden".into(), vec![1, 1, aux], Init::Normal));
        }
        for i in 0..self.num_layers {
            plan.push((format!("layers.{i}.input_layernorm.weight"), vec![h], Init::Ones));
            plan.push((
                format!("layers.{i}.post_attention_layernorm.weight"),
                vec![h],
                Init::Ones,
            ));
        }
        plan.push(("layers.0.hidden_norm.weight".into(), vec![h], Init::Ones));
        plan.push(("norm.weight".into(), vec![h], Init::Ones));
        let target_vocab = self.target_usize("vocab_size")?;
        plan.push((
            "embed_tokens.weight".into(),
            vec![target_vocab, h],
            Init::TargetEmbedding,
        ));
        plan.push(("lm_head.weight".into(), vec![self.vocab.len(), h], Init::TargetLmHead));
        Ok(plan)
    }
}

/// How a fresh run fills one weight.
enum Init {
    /// Normal draws, std `initializer_range`.
    Normal,
    /// Ones: a norm's scale.
    Ones,
    /// The target's embedding table.
    TargetEmbedding,
    /// The target's lm_head rows of the draft vocabulary.
    TargetLmHead,
}

/// A standard normal draw (Box-Muller), so initialisation depends on the seed alone.
fn gaussian(rng: &mut StdRng) -> f32 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

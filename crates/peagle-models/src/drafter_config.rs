//! Drafter head configs, in the speculators layout (what vLLM and our trainer write) and the
//! original EAGLE-3 / AWS layout (a Llama config plus EAGLE fields).

use crate::config::{read_json, TextConfig};
use crate::error::LoadError;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DraftAlgorithm {
    /// Autoregressive drafting: K drafter passes for K tokens.
    Eagle3,
    /// Parallel drafting: one pass for K tokens (mask token + shared hidden state).
    PEagle,
}

/// Where the first (fused-input) layer's tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorLayout {
    /// `layers.0.*`
    Speculators,
    /// `midlayer.*` (later layers are `layers.{i}.*` in both).
    Eagle3Midlayer,
}

#[derive(Debug, Clone)]
pub struct DrafterConfig {
    pub algorithm: DraftAlgorithm,
    /// Shape of the drafter's decoder layers; `vocab_size` is the target's.
    pub layers: TextConfig,
    pub draft_vocab_size: usize,
    /// Hidden size of the target, whose captured states `fc` reads.
    pub target_hidden_size: usize,
    pub norm_before_residual: bool,
    /// Feed back the normed (rather than pre-norm) output in autoregressive drafting.
    pub norm_output: bool,
    pub aux_layer_ids: Option<Vec<usize>>,
    pub mask_token_id: Option<u32>,
    /// The speculation depth the checkpoint was published with.
    pub num_speculative_tokens: Option<usize>,
    pub verifier: Option<String>,
    pub path: PathBuf,
}

impl DrafterConfig {
    pub fn from_file(path: &Path) -> Result<Self, LoadError> {
        Self::from_value(&read_json(path, "drafter config")?, path)
    }

    pub fn from_value(v: &Value, path: &Path) -> Result<Self, LoadError> {
        let invalid = |msg: String| LoadError::InvalidConfig {
            path: path.to_owned(),
            msg,
        };
        for unsupported in ["norm_before_fc", "fc_norm"] {
            if v[unsupported].as_bool() == Some(true) {
                return Err(invalid(format!("{unsupported} = true is not supported")));
            }
        }
        let speculators = v.get("speculators_model_type").and_then(Value::as_str);
        let (algorithm, layers) = match speculators {
            Some("eagle3") => (
                DraftAlgorithm::Eagle3,
                with_layer_defaults(&v["transformer_layer_config"]),
            ),
            Some("peagle") => (
                DraftAlgorithm::PEagle,
                with_layer_defaults(&v["transformer_layer_config"]),
            ),
            Some(other) => return Err(invalid(format!("unsupported speculators_model_type {other:?}"))),
            None => {
                let algorithm = match mask_token(v) {
                    Some(_) => DraftAlgorithm::PEagle,
                    None => DraftAlgorithm::Eagle3,
                };
                (algorithm, v.clone())
            }
        };
        if !layers.is_object() {
            return Err(invalid("transformer_layer_config is missing".into()));
        }
        let layers = TextConfig::from_value(layers, path)?;
        let usize_of = |key: &str| v[key].as_u64().map(|x| x as usize);
        let aux_ids = v
            .get("eagle_aux_hidden_state_layer_ids")
            .or_else(|| {
                v.get("eagle_config")
                    .and_then(|e| e.get("eagle_aux_hidden_state_layer_ids"))
            })
            .filter(|ids| !ids.is_null())
            .map(|ids| serde_json::from_value::<Vec<usize>>(ids.clone()))
            .transpose()
            .map_err(|e| invalid(format!("eagle_aux_hidden_state_layer_ids: {e}")))?;
        let spec = &v["speculators_config"];
        Ok(Self {
            algorithm,
            draft_vocab_size: usize_of("draft_vocab_size").unwrap_or(layers.vocab_size),
            target_hidden_size: usize_of("target_hidden_size").unwrap_or(layers.hidden_size),
            // speculators' eagle3 defaults to norming before the residual, everything else not.
            norm_before_residual: v["norm_before_residual"]
                .as_bool()
                .unwrap_or(speculators == Some("eagle3")),
            norm_output: v["norm_output"].as_bool().unwrap_or(false),
            aux_layer_ids: aux_ids,
            mask_token_id: mask_token(v),
            num_speculative_tokens: spec["proposal_methods"][0]["speculative_tokens"]
                .as_u64()
                .map(|k| k as usize),
            verifier: spec["verifier"]["name_or_path"].as_str().map(str::to_owned),
            layers,
            path: path.to_owned(),
        })
    }
}

/// The mask (placeholder) token id, under any of its published names.
fn mask_token(v: &Value) -> Option<u32> {
    ["mask_token_id", "pard_token", "ptd_token_id"]
        .iter()
        .find_map(|k| v[*k].as_u64())
        .map(|id| id as u32)
}

/// speculators writes `transformer_layer_config` as a diff against transformers' defaults for
/// its `model_type`; put the defaults back so the config parses like a full one.
fn with_layer_defaults(layer: &Value) -> Value {
    let defaults = match layer["model_type"].as_str() {
        Some("qwen3") => json!({
            "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "max_position_embeddings": 32768
        }),
        _ => json!({
            "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
            "num_hidden_layers": 32, "num_attention_heads": 32, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "max_position_embeddings": 2048
        }),
    };
    let mut merged = defaults;
    if let (Some(out), Some(given)) = (merged.as_object_mut(), layer.as_object()) {
        for (k, val) in given {
            out.insert(k.clone(), val.clone());
        }
        return merged;
    }
    layer.clone()
}

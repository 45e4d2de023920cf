//! Loading a Hugging Face model directory: config, weights, generation settings.

use crate::checkpoint::{Checkpoint, LoadOptions};
use crate::config::{read_json, TextConfig};
use crate::error::LoadError;
use crate::transformer::CausalLm;
use crate::{llama, qwen3};
use serde::Deserialize;
use std::path::{Path, PathBuf};

pub const SUPPORTED_ARCHITECTURES: &[&str] = &["LlamaForCausalLM", "Qwen3ForCausalLM"];

pub struct LoadedModel {
    pub model: CausalLm,
    pub config: TextConfig,
    pub generation: GenerationConfig,
    pub dir: PathBuf,
}

/// Token ids that end generation, from `generation_config.json` (else `config.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenerationConfig {
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
}

pub fn load_causal_lm(dir: &Path, options: LoadOptions) -> Result<LoadedModel, LoadError> {
    if !dir.is_dir() {
        return Err(LoadError::MissingFile {
            what: "model directory",
            path: dir.to_owned(),
        });
    }
    let config = TextConfig::from_file(&dir.join("config.json"))?;
    let arch = config.architectures.first().cloned().unwrap_or_default();
    let ckpt = Checkpoint::open(dir, options)?;
    let model = match arch.as_str() {
        "LlamaForCausalLM" => llama::load(&config, &ckpt)?,
        "Qwen3ForCausalLM" => qwen3::load(&config, &ckpt)?,
        _ => {
            return Err(LoadError::UnknownArchitecture {
                path: config.path.clone(),
                found: arch,
                supported: SUPPORTED_ARCHITECTURES,
            })
        }
    };
    let generation = GenerationConfig::load(dir)?;
    tracing::info!(dir = %dir.display(), arch, layers = model.dims().num_layers, "loaded model");
    Ok(LoadedModel {
        model,
        config,
        generation,
        dir: dir.to_owned(),
    })
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Deserialize, Default)]
struct TokenFields {
    #[serde(default)]
    eos_token_id: Option<OneOrMany>,
    #[serde(default)]
    bos_token_id: Option<u32>,
}

impl GenerationConfig {
    fn load(dir: &Path) -> Result<Self, LoadError> {
        let mut fields = TokenFields::default();
        for name in ["config.json", "generation_config.json"] {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            let found: TokenFields = serde_json::from_value(read_json(&path, "generation config")?)
                .map_err(|source| LoadError::Json { path, source })?;
            fields.eos_token_id = found.eos_token_id.or(fields.eos_token_id);
            fields.bos_token_id = found.bos_token_id.or(fields.bos_token_id);
        }
        Ok(Self {
            eos_token_ids: match fields.eos_token_id {
                None => Vec::new(),
                Some(OneOrMany::One(id)) => vec![id],
                Some(OneOrMany::Many(ids)) => ids,
            },
            bos_token_id: fields.bos_token_id,
        })
    }
}

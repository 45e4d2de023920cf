//! The registry of target architectures: the `architectures` name a model's config.json
//! gives, and the function that loads it. Adding an architecture is one file (declared in
//! lib.rs) and one line of `ARCHITECTURES`.

use crate::checkpoint::{Checkpoint, LoadOptions};
use crate::config::TextConfig;
use crate::error::LoadError;
use crate::generation_config::GenerationConfig;
use crate::target_model::TargetModel;
use std::path::{Path, PathBuf};

/// Builds an architecture's model from its config and weights.
type LoadFn = fn(&TextConfig, &Checkpoint) -> Result<Box<dyn TargetModel>, LoadError>;

const ARCHITECTURES: &[(&str, LoadFn)] = &[
    ("LlamaForCausalLM", crate::llama::load),
    ("Qwen3ForCausalLM", crate::qwen3::load),
    ("GptOssForCausalLM", crate::gpt_oss::load),
    ("Qwen3MoeForCausalLM", crate::qwen3_moe::load),
];

/// The names of the architectures this build loads.
pub fn supported_architectures() -> Vec<&'static str> {
    ARCHITECTURES.iter().map(|(name, _)| *name).collect()
}

pub struct LoadedModel {
    pub model: Box<dyn TargetModel>,
    pub config: TextConfig,
    pub generation: GenerationConfig,
    pub dir: PathBuf,
}

/// Loads the model of a Hugging Face directory with the architecture its config names.
pub fn load_target(dir: &Path, options: LoadOptions) -> Result<LoadedModel, LoadError> {
    if !dir.is_dir() {
        return Err(LoadError::MissingFile {
            what: "model directory",
            path: dir.to_owned(),
        });
    }
    let config = TextConfig::from_file(&dir.join("config.json"))?;
    let arch = config.architectures.first().cloned().unwrap_or_default();
    let ckpt = Checkpoint::open(dir, options)?.with_fp8_blocks(config.fp8_weight_blocks()?);
    let Some((_, load)) = ARCHITECTURES.iter().find(|(name, _)| *name == arch) else {
        return Err(LoadError::UnknownArchitecture {
            path: config.path.clone(),
            found: arch,
            supported: supported_architectures(),
        });
    };
    let model = load(&config, &ckpt)?;
    let generation = GenerationConfig::load(dir)?;
    tracing::info!(dir = %dir.display(), arch, layers = model.dims().num_layers, "loaded model");
    Ok(LoadedModel {
        model,
        config,
        generation,
        dir: dir.to_owned(),
    })
}

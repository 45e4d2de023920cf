//! From model directories to a running engine: load the target (and drafter), size the KV
//! cache, start the engine thread, and read the tokenizer and chat template for the HTTP side.

use crate::served_model::{ModelFilesError, ServedModel};
use candle_core::DType;
use peagle_engine::{CacheConfig, EngineConfig, EngineHandle, GenerateError, ModelRunner, SpeculativeConfig};
use peagle_models::{Drafter, GenerationConfig, KvCache, KvCacheDtype, LoadOptions, ModelDims, SamplingDefaults};
use std::path::PathBuf;
use thiserror::Error;

/// KV cache sizing when --kv-cache-blocks is not given: room for every sequence the scheduler
/// may run at full length, but at most this many bytes (target and drafter caches together).
const DEFAULT_KV_BUDGET_BYTES: usize = 4 << 30;

/// When neither the model's config nor the flags give a context length.
const FALLBACK_MAX_MODEL_LEN: usize = 4096;

#[derive(Debug, Error)]
pub enum StartError {
    #[error(transparent)]
    Engine(#[from] GenerateError),
    #[error(transparent)]
    ModelFiles(#[from] ModelFilesError),
    #[error("{0}")]
    Config(String),
}

#[derive(Debug, Clone)]
pub struct DraftModel {
    pub dir: PathBuf,
    /// Drafts per step; default: the checkpoint's published value, else 3.
    pub k: Option<usize>,
    /// Draft all K tokens in one P-EAGLE pass. P-EAGLE checkpoints always do.
    pub parallel: bool,
}

/// Where requests' sampling defaults come from (vLLM's `--generation-config`).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum GenerationDefaults {
    /// The model's generation_config.json, as its authors recommend.
    #[default]
    Auto,
    /// OpenAI's neutral defaults (`vllm`).
    Neutral,
    /// The generation_config.json of another directory.
    Dir(PathBuf),
}

#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub model_dir: PathBuf,
    pub draft: Option<DraftModel>,
    pub load: LoadOptions,
    /// Default: the model's max_position_embeddings.
    pub max_model_len: Option<usize>,
    /// Default: see DEFAULT_KV_BUDGET_BYTES.
    pub kv_cache_blocks: Option<usize>,
    pub block_size: usize,
    pub kv_cache_dtype: KvCacheDtype,
    pub engine: EngineConfig,
    pub generation_defaults: GenerationDefaults,
}

impl EngineOptions {
    pub fn new(model_dir: PathBuf) -> Self {
        Self {
            model_dir,
            draft: None,
            load: LoadOptions::default(),
            max_model_len: None,
            kv_cache_blocks: None,
            block_size: 16,
            kv_cache_dtype: KvCacheDtype::Auto,
            engine: EngineConfig::default(),
            generation_defaults: GenerationDefaults::Auto,
        }
    }
}

/// Loads everything and starts the engine; the model is served under `name`.
pub fn start_engine(name: String, opts: &EngineOptions) -> Result<(EngineHandle, ServedModel), StartError> {
    let scheduler = &opts.engine.scheduler;
    let counts = [
        ("--block-size", opts.block_size),
        ("--max-num-seqs", scheduler.max_num_seqs),
        ("--max-num-batched-tokens", scheduler.max_num_batched_tokens),
        // Every request waits for admission, if only for a step: a limit of 0 refuses them all.
        ("--max-waiting-requests", opts.engine.max_waiting),
    ];
    if let Some((flag, _)) = counts.iter().find(|(_, n)| *n == 0) {
        return Err(StartError::Config(format!("{flag} must be at least 1")));
    }
    let mut served = ServedModel::from_dir(name, &opts.model_dir)?;
    let loaded = peagle_models::load_causal_lm(&opts.model_dir, opts.load.clone()).map_err(GenerateError::from)?;
    served.sampling_defaults = match &opts.generation_defaults {
        GenerationDefaults::Auto => loaded.generation.sampling.clone(),
        GenerationDefaults::Neutral => SamplingDefaults::default(),
        GenerationDefaults::Dir(dir) if !dir.join("generation_config.json").is_file() => {
            return Err(StartError::Config(format!(
                "--generation-config {}: no generation_config.json there",
                dir.display()
            )))
        }
        GenerationDefaults::Dir(dir) => GenerationConfig::load(dir).map_err(GenerateError::from)?.sampling,
    };
    if served.sampling_defaults != SamplingDefaults::default() {
        tracing::info!(
            defaults = ?served.sampling_defaults,
            "requests that leave sampling fields out get the generation config's values \
             (--generation-config vllm for OpenAI's)"
        );
    }
    let native_len = loaded.config.max_position_embeddings;
    let max_model_len = match (opts.max_model_len, native_len) {
        (Some(asked), Some(native)) if asked > native => {
            return Err(StartError::Config(format!(
                "--max-model-len {asked} is more than the model's max_position_embeddings ({native})"
            )))
        }
        (Some(asked), _) => asked,
        (None, native) => native.unwrap_or(FALLBACK_MAX_MODEL_LEN),
    };
    if max_model_len < 2 {
        return Err(StartError::Config(format!(
            "--max-model-len must be at least 2, got {max_model_len}"
        )));
    }
    let drafter = match &opts.draft {
        None => None,
        Some(d) => {
            let drafter = Drafter::load(&d.dir, &loaded.model, opts.load.clone()).map_err(GenerateError::from)?;
            let k = d.k.or(drafter.config().num_speculative_tokens).unwrap_or(3);
            let parallel = d.parallel || drafter.is_parallel();
            Some((drafter, SpeculativeConfig { k, parallel }))
        }
    };
    let dtype = opts.kv_cache_dtype.resolve(&loaded.config);
    let num_blocks = match opts.kv_cache_blocks {
        Some(n) => n,
        None => default_num_blocks(loaded.model.dims(), drafter.as_ref(), max_model_len, dtype, opts),
    };
    tracing::info!(
        model = %opts.model_dir.display(),
        drafter = ?opts.draft.as_ref().map(|d| d.dir.display().to_string()),
        speculative = ?drafter.as_ref().map(|(_, s)| s),
        max_model_len,
        num_blocks,
        kv_cache_dtype = ?dtype,
        "starting the engine"
    );
    let eos = loaded.generation.eos_token_ids.clone();
    let cache = CacheConfig {
        num_blocks,
        block_size: opts.block_size,
        dtype,
    };
    let runner = ModelRunner::new(loaded.model, drafter, eos, max_model_len, cache)?;
    Ok((EngineHandle::start(runner, opts.engine.clone()), served))
}

fn default_num_blocks(
    target: &ModelDims,
    drafter: Option<&(Drafter, SpeculativeConfig)>,
    max_model_len: usize,
    dtype: DType,
    opts: &EngineOptions,
) -> usize {
    let k = drafter.map_or(0, |(_, s)| s.k);
    let per_sequence = CacheConfig::blocks_per_sequence(max_model_len, k, opts.block_size);
    let block_bytes = |d: &ModelDims| KvCache::bytes_per_block(d, opts.block_size, dtype);
    let bytes_per_block = (block_bytes(target) + drafter.map_or(0, |(d, _)| block_bytes(d.dims()))).max(1);
    let wanted = per_sequence * opts.engine.scheduler.max_num_seqs;
    wanted.min(DEFAULT_KV_BUDGET_BYTES / bytes_per_block).max(per_sequence)
}

//! Generation for one prompt at a time on the model runner: chunked prefill, then one
//! (speculative) step after another. The serving engine schedules many sequences on the same
//! runner.

use crate::block_manager::OutOfBlocks;
use crate::detokenizer::{special_token_ids, IncrementalDecoder};
use crate::model_runner::{CacheConfig, ModelRunner, SpeculativeConfig, Work};
use crate::sampler::InvalidSampling;
use crate::sequence::{FinishReason, GenerateParams, Sequence};
use crate::spec_stats::SpecStats;
use peagle_models::{Drafter, KvCacheDtype, LoadError, LoadOptions, LoadedModel};
use std::path::{Path, PathBuf};
use std::time::Instant;
use thiserror::Error;
use tokenizers::Tokenizer;

#[derive(Debug, Error)]
pub enum GenerateError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("missing tokenizer: {0}")]
    MissingTokenizer(PathBuf),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("model forward failed: {0}")]
    Model(#[from] candle_core::Error),
    #[error("the prompt is empty (no tokens)")]
    EmptyPrompt,
    #[error("the prompt has {tokens} tokens but the model accepts at most {max}")]
    PromptTooLong { tokens: usize, max: usize },
    #[error("max_tokens must be at least 1")]
    NoTokensRequested,
    #[error(transparent)]
    InvalidSampling(#[from] InvalidSampling),
    #[error(transparent)]
    OutOfBlocks(#[from] OutOfBlocks),
    #[error("{0}")]
    Config(String),
}

#[derive(Debug, Clone)]
pub struct GeneratorOptions {
    pub block_size: usize,
    /// Longest sequence (prompt + generated); the KV cache is sized for one of these.
    pub max_model_len: Option<usize>,
    /// Prefill is split into chunks of at most this many tokens.
    pub max_batched_tokens: usize,
    pub kv_cache_dtype: KvCacheDtype,
}

impl Default for GeneratorOptions {
    fn default() -> Self {
        Self {
            block_size: 16,
            max_model_len: None,
            max_batched_tokens: 512,
            kv_cache_dtype: KvCacheDtype::Auto,
        }
    }
}

/// A draft model and how to use it.
#[derive(Debug, Clone)]
pub struct DraftOptions {
    pub dir: PathBuf,
    pub speculative: SpeculativeConfig,
}

#[derive(Debug, Clone)]
pub struct GenerateOutput {
    pub prompt_tokens: usize,
    /// Generated tokens, without a final end-of-sequence token.
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    /// Time to first token.
    pub prefill_seconds: f64,
    /// Time of every later step.
    pub decode_seconds: f64,
    pub spec_stats: SpecStats,
}

pub struct Generator {
    runner: ModelRunner,
    tokenizer: Option<Tokenizer>,
    max_batched_tokens: usize,
}

impl Generator {
    pub fn new(
        loaded: LoadedModel,
        drafter: Option<(Drafter, SpeculativeConfig)>,
        tokenizer: Option<Tokenizer>,
        opts: &GeneratorOptions,
    ) -> Result<Self, GenerateError> {
        let max_model_len = opts
            .max_model_len
            .or(loaded.config.max_position_embeddings)
            .unwrap_or(4096);
        // Room for one sequence at full length: the generator runs one at a time.
        let k = drafter.as_ref().map_or(0, |(_, s)| s.k);
        let cache = CacheConfig {
            num_blocks: CacheConfig::blocks_per_sequence(max_model_len, k, opts.block_size),
            block_size: opts.block_size,
            dtype: opts.kv_cache_dtype.resolve(&loaded.config),
        };
        let eos = loaded.generation.eos_token_ids.clone();
        Ok(Self {
            runner: ModelRunner::new(loaded.model, drafter, eos, max_model_len, cache)?,
            tokenizer,
            max_batched_tokens: opts.max_batched_tokens.max(1),
        })
    }

    /// Loads the model, its `tokenizer.json` and an optional draft model.
    pub fn from_dir(
        dir: &Path,
        draft: Option<&DraftOptions>,
        load: LoadOptions,
        opts: &GeneratorOptions,
    ) -> Result<Self, GenerateError> {
        let loaded = peagle_models::load_target(dir, load.clone())?;
        let drafter = match draft {
            None => None,
            Some(d) => Some((Drafter::load(&d.dir, loaded.model.as_ref(), load)?, d.speculative)),
        };
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(GenerateError::MissingTokenizer(path));
        }
        let tokenizer =
            Tokenizer::from_file(&path).map_err(|e| GenerateError::Tokenizer(format!("{}: {e}", path.display())))?;
        Self::new(loaded, drafter, Some(tokenizer), opts)
    }

    pub fn runner(&self) -> &ModelRunner {
        &self.runner
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// The token ids of `prompt`, or the error generating from it would give (empty, longer
    /// than the context), so a batch of prompts can be checked before any runs.
    pub fn prompt_ids(&self, prompt: &str) -> Result<Vec<u32>, GenerateError> {
        let tokenizer = self.required_tokenizer()?;
        let ids = tokenizer
            .encode(prompt, true)
            .map_err(|e| GenerateError::Tokenizer(e.to_string()))?
            .get_ids()
            .to_vec();
        self.check_prompt(&ids)?;
        Ok(ids)
    }

    /// Generates from prompt token ids (see `prompt_ids`) and streams stable text to `on_text`
    /// as it appears; special tokens add no text, as vLLM's default `skip_special_tokens` has it.
    pub fn generate_text(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerateOutput, GenerateError> {
        let tokenizer = self.required_tokenizer()?.clone();
        let special = special_token_ids(&tokenizer);
        let mut decoder = IncrementalDecoder::new();
        let mut failure = None;
        let out = self.generate(prompt, params, |id| {
            if special.contains(&id) {
                return;
            }
            match decoder.push(&tokenizer, id) {
                Ok(text) => on_text(&text),
                Err(e) => failure = Some(e.to_string()),
            }
        })?;
        match failure {
            Some(e) => Err(GenerateError::Tokenizer(e)),
            None => {
                let rest = decoder
                    .flush(&tokenizer)
                    .map_err(|e| GenerateError::Tokenizer(e.to_string()))?;
                on_text(&rest);
                Ok(out)
            }
        }
    }

    /// Generates from prompt token ids, calling `on_token` for each committed token but an
    /// end-of-sequence or stop token that ends the output (counted, not shown).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: impl FnMut(u32),
    ) -> Result<GenerateOutput, GenerateError> {
        params.sampling.validate()?;
        self.check_prompt(prompt)?;
        if params.max_tokens == 0 {
            return Err(GenerateError::NoTokensRequested);
        }
        let mut seq = Sequence::new(prompt.to_vec(), params.clone());
        let result = self.run(&mut seq, on_token);
        self.runner.release(&mut seq);
        result
    }

    fn check_prompt(&self, prompt: &[u32]) -> Result<(), GenerateError> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        let max_len = self.runner.max_model_len();
        if prompt.len() >= max_len {
            return Err(GenerateError::PromptTooLong {
                tokens: prompt.len(),
                max: max_len - 1,
            });
        }
        Ok(())
    }

    fn required_tokenizer(&self) -> Result<&Tokenizer, GenerateError> {
        self.tokenizer()
            .ok_or_else(|| GenerateError::Tokenizer("no tokenizer loaded".into()))
    }

    fn run(&mut self, seq: &mut Sequence, mut on_token: impl FnMut(u32)) -> Result<GenerateOutput, GenerateError> {
        let start = Instant::now();
        let mut prefill_seconds = None;
        while seq.finish.is_none() {
            let work = if seq.in_prefill() {
                Work::Prefill(self.max_batched_tokens)
            } else {
                Work::Decode
            };
            let k = self.runner.k();
            let (step_started, phases_before) = (Instant::now(), self.runner.times().phases());
            self.runner.step(&mut [(&mut *seq, work)], k)?;
            self.runner
                .record_step(step_started.elapsed().as_secs_f64(), phases_before);
            if work != Work::Decode && prefill_seconds.is_none() && !seq.in_prefill() {
                prefill_seconds = Some(start.elapsed().as_secs_f64());
            }
            seq.outputs.drain(..).filter(|t| !t.stops).for_each(|t| on_token(t.id));
        }
        let prefill_seconds = prefill_seconds.unwrap_or_else(|| start.elapsed().as_secs_f64());
        Ok(GenerateOutput {
            prompt_tokens: seq.num_prompt_tokens,
            token_ids: seq.generated().to_vec(),
            finish_reason: seq.finish.unwrap_or(FinishReason::Length),
            prefill_seconds,
            decode_seconds: start.elapsed().as_secs_f64() - prefill_seconds,
            spec_stats: seq.spec_stats.clone(),
        })
    }
}

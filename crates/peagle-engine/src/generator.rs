//! Generation for one prompt at a time: the engine stepped on the caller's thread until the
//! request finishes (peagle-generate, the trainer's capture, tests and benches).

use crate::builder::{DraftModel, EngineBuilder};
use crate::detokenizer::{special_token_ids, IncrementalDecoder};
use crate::engine::Engine;
use crate::error::GenerateError;
use crate::kv_budget::DEFAULT_GPU_MEMORY_UTILIZATION;
use crate::request::{validate_prompt, Event, FinishReason, GenerateParams, Request};
use crate::scheduler::SchedulerConfig;
use crate::spec_stats::SpecStats;
use peagle_models::{KvCacheDtype, LoadOptions};
use std::path::Path;
use std::time::Instant;
use tokenizers::Tokenizer;
use tokio::sync::mpsc::unbounded_channel;

#[derive(Debug, Clone)]
pub struct GeneratorOptions {
    pub block_size: usize,
    /// Longest sequence (prompt + generated); the KV cache is sized for one of these.
    pub max_model_len: Option<usize>,
    /// Prefill is split into chunks of at most this many tokens.
    pub max_batched_tokens: usize,
    pub kv_cache_dtype: KvCacheDtype,
    /// Run decode and verification steps, and the drafter's passes, by CUDA graphs (a GPU only).
    pub cuda_graphs: bool,
    /// The share of a GPU's memory the engine may fill (`EngineBuilder`'s).
    pub gpu_memory_utilization: f64,
}

impl Default for GeneratorOptions {
    fn default() -> Self {
        Self {
            block_size: 16,
            max_model_len: None,
            max_batched_tokens: 512,
            kv_cache_dtype: KvCacheDtype::Auto,
            cuda_graphs: false,
            gpu_memory_utilization: DEFAULT_GPU_MEMORY_UTILIZATION,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateOutput {
    pub prompt_tokens: usize,
    /// Generated tokens, an end-of-sequence or stop token that ended them included.
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
    /// Time to first token.
    pub prefill_seconds: f64,
    /// Time of every later step.
    pub decode_seconds: f64,
    pub spec_stats: SpecStats,
}

pub struct Generator {
    engine: Engine,
    tokenizer: Option<Tokenizer>,
}

impl Generator {
    pub fn new(engine: Engine, tokenizer: Option<Tokenizer>) -> Self {
        Self { engine, tokenizer }
    }

    /// Loads the model, its `tokenizer.json` and an optional draft model, with a KV cache for
    /// one sequence of full length and the drafter's full K at every step.
    pub fn from_dir(
        dir: &Path,
        draft: Option<&DraftModel>,
        load: LoadOptions,
        opts: &GeneratorOptions,
    ) -> Result<Self, GenerateError> {
        let builder = EngineBuilder {
            draft: draft.cloned(),
            load,
            max_model_len: opts.max_model_len,
            block_size: opts.block_size,
            kv_cache_dtype: opts.kv_cache_dtype,
            cuda_graphs: opts.cuda_graphs,
            gpu_memory_utilization: opts.gpu_memory_utilization,
            scheduler: SchedulerConfig {
                max_num_seqs: 1,
                max_num_batched_tokens: opts.max_batched_tokens,
                adaptive_k: false,
                ..SchedulerConfig::default()
            },
            ..EngineBuilder::new(dir.to_owned())
        };
        let engine = builder.build()?.engine;
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(GenerateError::MissingTokenizer(path));
        }
        let tokenizer =
            Tokenizer::from_file(&path).map_err(|e| GenerateError::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Self::new(engine, Some(tokenizer)))
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
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
        validate_prompt(&ids, self.engine.max_model_len(), self.vocab_size())?;
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
        let mut decoder =
            IncrementalDecoder::after(&tokenizer, prompt).map_err(|e| GenerateError::Tokenizer(e.to_string()))?;
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
        mut on_token: impl FnMut(u32),
    ) -> Result<GenerateOutput, GenerateError> {
        let request = Request::new(prompt.to_vec(), params.clone());
        request.validate(self.engine.max_model_len(), self.vocab_size())?;
        let (events, mut rx) = unbounded_channel();
        self.engine.add(request, events);
        let start = Instant::now();
        let mut prefill_seconds = None;
        let mut token_ids = Vec::new();
        loop {
            self.engine.step();
            while let Ok(event) = rx.try_recv() {
                match event {
                    Event::Tokens(tokens) => {
                        prefill_seconds.get_or_insert_with(|| start.elapsed().as_secs_f64());
                        token_ids.extend(tokens.iter().map(|t| t.id));
                        tokens.iter().filter(|t| !t.stops).for_each(|t| on_token(t.id));
                    }
                    Event::Finished { reason, spec_stats, .. } => {
                        let prefill_seconds = prefill_seconds.unwrap_or_else(|| start.elapsed().as_secs_f64());
                        return Ok(GenerateOutput {
                            prompt_tokens: prompt.len(),
                            token_ids,
                            finish_reason: reason,
                            prefill_seconds,
                            decode_seconds: start.elapsed().as_secs_f64() - prefill_seconds,
                            spec_stats,
                        });
                    }
                    Event::Failed(message) => return Err(GenerateError::Step(message)),
                    Event::Scheduled(_) | Event::PromptLogprobs(_) => {}
                }
            }
            if self.engine.is_idle() {
                return Err(GenerateError::Step("the request left the engine unfinished".into()));
            }
        }
    }

    fn vocab_size(&self) -> usize {
        self.engine.target().dims().vocab_size
    }

    fn required_tokenizer(&self) -> Result<&Tokenizer, GenerateError> {
        self.tokenizer()
            .ok_or_else(|| GenerateError::Tokenizer("no tokenizer loaded".into()))
    }
}

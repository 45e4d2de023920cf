//! Generation for one prompt at a time: chunked prefill, then one token per step. The
//! continuous-batching engine schedules many sequences with the same pieces.

use crate::block_manager::{BlockManager, OutOfBlocks};
use crate::detokenizer::IncrementalDecoder;
use crate::sampler::{InvalidSampling, Sampler, SamplingParams};
use crate::sequence::Sequence;
use candle_core::Tensor;
use peagle_models::{BatchBuilder, CausalLm, GenerationConfig, KvCache, LoadError, LoadOptions, LoadedModel, Rows};
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
}

#[derive(Debug, Clone)]
pub struct GeneratorOptions {
    pub block_size: usize,
    /// Longest sequence (prompt + generated); the KV cache is sized for one of these.
    pub max_model_len: Option<usize>,
    /// Prefill is split into chunks of at most this many tokens.
    pub max_batched_tokens: usize,
}

impl Default for GeneratorOptions {
    fn default() -> Self {
        Self {
            block_size: 16,
            max_model_len: None,
            max_batched_tokens: 512,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Keep going past end-of-sequence tokens (benchmarks, reference comparisons).
    pub ignore_eos: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was sampled.
    Stop,
    /// max_tokens or the model's length limit was reached.
    Length,
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
}

pub struct Generator {
    model: CausalLm,
    generation: GenerationConfig,
    tokenizer: Option<Tokenizer>,
    kv: KvCache,
    blocks: BlockManager,
    max_model_len: usize,
    max_batched_tokens: usize,
}

impl Generator {
    pub fn new(
        loaded: LoadedModel,
        tokenizer: Option<Tokenizer>,
        opts: &GeneratorOptions,
    ) -> Result<Self, GenerateError> {
        let max_model_len = opts
            .max_model_len
            .or(loaded.config.max_position_embeddings)
            .unwrap_or(4096);
        let num_blocks = max_model_len.div_ceil(opts.block_size);
        let kv = KvCache::new(loaded.model.dims(), num_blocks, opts.block_size, loaded.model.device())?;
        Ok(Self {
            model: loaded.model,
            generation: loaded.generation,
            tokenizer,
            kv,
            blocks: BlockManager::new(num_blocks, opts.block_size),
            max_model_len,
            max_batched_tokens: opts.max_batched_tokens.max(1),
        })
    }

    /// Loads the model and its `tokenizer.json` from a Hugging Face directory.
    pub fn from_dir(dir: &Path, load: LoadOptions, opts: &GeneratorOptions) -> Result<Self, GenerateError> {
        let loaded = peagle_models::load_causal_lm(dir, load)?;
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(GenerateError::MissingTokenizer(path));
        }
        let tokenizer =
            Tokenizer::from_file(&path).map_err(|e| GenerateError::Tokenizer(format!("{}: {e}", path.display())))?;
        Self::new(loaded, Some(tokenizer), opts)
    }

    pub fn model(&self) -> &CausalLm {
        &self.model
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// Tokenizes `prompt`, generates, and streams stable text to `on_text` as it appears.
    pub fn generate_text(
        &mut self,
        prompt: &str,
        params: &GenerateParams,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerateOutput, GenerateError> {
        let tokenizer = self
            .tokenizer
            .clone()
            .ok_or_else(|| GenerateError::Tokenizer("no tokenizer loaded".into()))?;
        let ids = tokenizer
            .encode(prompt, true)
            .map_err(|e| GenerateError::Tokenizer(e.to_string()))?
            .get_ids()
            .to_vec();
        let mut decoder = IncrementalDecoder::new();
        let mut failure = None;
        let out = self.generate(&ids, params, |id| match decoder.push(&tokenizer, id) {
            Ok(text) => on_text(&text),
            Err(e) => failure = Some(e.to_string()),
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

    /// Generates from prompt token ids, calling `on_token` for each generated token.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenerateParams,
        on_token: impl FnMut(u32),
    ) -> Result<GenerateOutput, GenerateError> {
        params.sampling.validate()?;
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        if params.max_tokens == 0 {
            return Err(GenerateError::NoTokensRequested);
        }
        if prompt.len() >= self.max_model_len {
            return Err(GenerateError::PromptTooLong {
                tokens: prompt.len(),
                max: self.max_model_len - 1,
            });
        }
        let mut seq = Sequence::new(prompt.to_vec());
        let result = self.run(&mut seq, params, on_token);
        self.blocks.release(&mut seq.block_table);
        result
    }

    fn run(
        &mut self,
        seq: &mut Sequence,
        params: &GenerateParams,
        mut on_token: impl FnMut(u32),
    ) -> Result<GenerateOutput, GenerateError> {
        let mut sampler = Sampler::new(params.sampling.seed);
        let start = Instant::now();
        let mut logits = self.prefill(seq)?;
        let prefill_seconds = start.elapsed().as_secs_f64();
        let finish_reason = loop {
            let token = sampler.sample(&logits, &params.sampling);
            if !params.ignore_eos && self.generation.eos_token_ids.contains(&token) {
                break FinishReason::Stop;
            }
            seq.token_ids.push(token);
            on_token(token);
            if seq.generated().len() >= params.max_tokens || seq.len() >= self.max_model_len {
                break FinishReason::Length;
            }
            logits = self.forward(seq, seq.len(), true)?;
        };
        Ok(GenerateOutput {
            prompt_tokens: seq.num_prompt_tokens,
            token_ids: seq.generated().to_vec(),
            finish_reason,
            prefill_seconds,
            decode_seconds: start.elapsed().as_secs_f64() - prefill_seconds,
        })
    }

    /// Runs the prompt in chunks; returns the logits of its last token.
    fn prefill(&mut self, seq: &mut Sequence) -> Result<Vec<f32>, GenerateError> {
        loop {
            let end = (seq.num_cached + self.max_batched_tokens).min(seq.len());
            let logits = self.forward(seq, end, end == seq.len())?;
            if end == seq.len() {
                return Ok(logits);
            }
        }
    }

    /// Caches tokens `num_cached..end` of `seq`; returns the last row's logits when asked.
    fn forward(&mut self, seq: &mut Sequence, end: usize, logits: bool) -> Result<Vec<f32>, GenerateError> {
        self.blocks.grow(&mut seq.block_table, end)?;
        let mut batch = BatchBuilder::new(self.kv.block_size());
        let rows = if logits { Rows::Last } else { Rows::None };
        batch.add(
            &seq.token_ids[seq.num_cached..end],
            seq.num_cached,
            &seq.block_table,
            rows,
            Rows::None,
        )?;
        let out = self.model.forward(&batch.build(), &self.kv)?;
        seq.num_cached = end;
        if !logits {
            return Ok(Vec::new());
        }
        Ok(row(&out.logits, 0)?)
    }
}

fn row(t: &Tensor, i: usize) -> candle_core::Result<Vec<f32>> {
    t.get(i)?.to_vec1()
}

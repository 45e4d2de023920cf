//! What goes into the engine and what comes out: a tokenized request, and the events of its
//! progress.

use crate::sampling_params::{InvalidSampling, SamplingParams};
use crate::spec_stats::SpecStats;
use std::time::Instant;
use thiserror::Error;

#[derive(Debug, Clone, Default)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Keep going past end-of-sequence tokens (benchmarks, reference comparisons).
    pub ignore_eos: bool,
    /// End-of-sequence and `stop_token_ids` cannot be chosen before this many tokens.
    pub min_tokens: usize,
    /// More tokens that end the sequence (vLLM); `ignore_eos` does not apply to them.
    pub stop_token_ids: Vec<u32>,
}

/// A committed token with its log-probability under the target model (before temperature).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOutput {
    pub id: u32,
    pub logprob: Option<f32>,
    /// The most likely tokens at this position, most likely first.
    pub top_logprobs: Vec<(u32, f32)>,
    /// The token's rank in its row, 1 for the most likely (vLLM's: the tokens at least as
    /// likely, itself included); given for scored prompt tokens.
    pub rank: Option<u32>,
    /// This token ended the sequence: an end-of-sequence or stop token. It counts as
    /// generated, with its log-probability, but its text is not part of the output unless the
    /// request asks for it (vLLM's rule).
    pub stops: bool,
}

impl TokenOutput {
    /// `id` without log-probabilities.
    pub fn bare(id: u32) -> Self {
        Self {
            id,
            logprob: None,
            top_logprobs: Vec::new(),
            rank: None,
            stops: false,
        }
    }
}

/// One generation request, already tokenized.
#[derive(Debug, Clone)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: GenerateParams,
    /// Per-request opt-out of speculative decoding.
    pub speculate: bool,
    /// Return the log-probability of each token and this many top alternatives.
    pub logprobs: Option<usize>,
    /// Also return the prompt tokens' log-probabilities (none for the first) with this many
    /// alternatives, as vLLM's `prompt_logprobs`.
    pub prompt_logprobs: Option<usize>,
    /// Cached prefix blocks are shared only among requests with the same salt, and those
    /// without one (vLLM's `cache_salt`): a tenant's prompts cannot be probed by another's
    /// timing. Never empty.
    pub cache_salt: Option<String>,
}

/// Why the engine refuses a request: every way in (the server, `Generator`) checks requests
/// with `Request::validate`.
#[derive(Debug, Error, PartialEq)]
pub enum InvalidRequest {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("the prompt has {tokens} tokens but the model's context is {max_model_len} tokens")]
    PromptTooLong { tokens: usize, max_model_len: usize },
    #[error("max_tokens must be at least 1")]
    NoTokens,
    #[error("cache_salt must not be empty")]
    EmptyCacheSalt,
    #[error(transparent)]
    Sampling(#[from] InvalidSampling),
    #[error("token id {token} is outside the vocabulary (size {vocab_size})")]
    OutsideVocabulary {
        param: &'static str,
        token: u32,
        vocab_size: usize,
    },
}

impl InvalidRequest {
    /// The request field at fault, as the OpenAI API names it.
    pub fn param(&self) -> &'static str {
        match self {
            Self::EmptyPrompt | Self::PromptTooLong { .. } => "prompt",
            Self::NoTokens => "max_tokens",
            Self::EmptyCacheSalt => "cache_salt",
            Self::Sampling(e) => e.param(),
            Self::OutsideVocabulary { param, .. } => param,
        }
    }
}

impl Request {
    /// A request for `prompt` under `params` that may speculate, with no log-probabilities and
    /// no cache salt.
    pub fn new(prompt: Vec<u32>, params: GenerateParams) -> Self {
        Self {
            prompt,
            params,
            speculate: true,
            logprobs: None,
            prompt_logprobs: None,
            cache_salt: None,
        }
    }

    /// A request the engine can run with a model of `vocab_size` tokens and a context of
    /// `max_model_len`: a prompt that leaves room for one token, at least one token asked
    /// for, sampling fields in range, and prompt, stop, biased, allowed and banned tokens in the vocabulary (a
    /// token outside it would fail the whole step it ran in, other requests' included).
    pub fn validate(&self, max_model_len: usize, vocab_size: usize) -> Result<(), InvalidRequest> {
        validate_prompt(&self.prompt, max_model_len, vocab_size)?;
        let params = &self.params;
        if params.max_tokens == 0 {
            return Err(InvalidRequest::NoTokens);
        }
        if self.cache_salt.as_ref().is_some_and(String::is_empty) {
            return Err(InvalidRequest::EmptyCacheSalt);
        }
        params.sampling.validate()?;
        let stops = params.stop_token_ids.iter().map(|t| ("stop_token_ids", *t));
        let biased = params
            .sampling
            .penalties
            .logit_bias
            .iter()
            .map(|(t, _)| ("logit_bias", *t));
        let bans = &params.sampling.bans;
        let allowed = bans.allowed.iter().flatten().map(|t| ("allowed_token_ids", *t));
        let bad = bans.bad_words.iter().flatten().map(|t| ("bad_words", *t));
        in_vocabulary(stops.chain(biased).chain(allowed).chain(bad), vocab_size)
    }
}

/// The prompt's part of `Request::validate`: not empty, room left for one token, every id in
/// the vocabulary.
pub fn validate_prompt(prompt: &[u32], max_model_len: usize, vocab_size: usize) -> Result<(), InvalidRequest> {
    if prompt.is_empty() {
        return Err(InvalidRequest::EmptyPrompt);
    }
    if prompt.len() >= max_model_len {
        return Err(InvalidRequest::PromptTooLong {
            tokens: prompt.len(),
            max_model_len,
        });
    }
    in_vocabulary(prompt.iter().map(|t| ("prompt", *t)), vocab_size)
}

/// The first of the (field, token id) pairs outside a vocabulary of `vocab_size`, as an error.
fn in_vocabulary(ids: impl Iterator<Item = (&'static str, u32)>, vocab_size: usize) -> Result<(), InvalidRequest> {
    match ids.into_iter().find(|(_, t)| *t as usize >= vocab_size) {
        Some((param, token)) => Err(InvalidRequest::OutsideVocabulary {
            param,
            token,
            vocab_size,
        }),
        None => Ok(()),
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The request left the queue for its first engine step, at this instant (once, even if
    /// it is preempted and admitted again later).
    Scheduled(Instant),
    /// The prompt's tokens with their log-probabilities, in order, when asked for; they come
    /// before the first `Tokens`, possibly over several events (chunked prefill).
    PromptLogprobs(Vec<TokenOutput>),
    /// Tokens committed by one engine step, in order.
    Tokens(Vec<TokenOutput>),
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Prompt tokens found in the prefix cache.
        cached_tokens: usize,
        /// This request's verifications.
        spec_stats: SpecStats,
    },
    /// The request failed; no more events follow.
    Failed(String),
}

/// How a request ended: the one finish reason of the engine and the API alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was sampled (or, on the API, a stop string appeared).
    Stop,
    /// One of the request's `stop_token_ids` was sampled.
    StopToken(u32),
    /// max_tokens or the model's length limit was reached.
    Length,
    /// Ended early: the client left, the engine failed, or the server stopped waiting.
    Abort,
}

impl FinishReason {
    /// Every `as_str` value, in a fixed order (metrics labels).
    pub const NAMES: [&'static str; 3] = ["stop", "length", "abort"];

    /// OpenAI's `finish_reason`: a stop token is a "stop".
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self.index()]
    }

    /// Position of `as_str` in `NAMES`.
    pub fn index(self) -> usize {
        match self {
            Self::Stop | Self::StopToken(_) => 0,
            Self::Length => 1,
            Self::Abort => 2,
        }
    }
}

//! What goes into the engine and what comes out: a tokenized request, and the events of its
//! progress.

use crate::sampler::InvalidSampling;
use crate::sequence::{GenerateParams, TokenOutput};
use crate::spec_stats::SpecStats;
use std::time::Instant;
use thiserror::Error;

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
    #[error(transparent)]
    Sampling(#[from] InvalidSampling),
}

impl Request {
    /// A request the engine can run within a context of `max_model_len` tokens: a prompt
    /// that leaves room for one token, at least one token asked for, valid sampling.
    pub fn validate(&self, max_model_len: usize) -> Result<(), InvalidRequest> {
        validate(&self.prompt, &self.params, max_model_len)
    }
}

/// `Request::validate` of a prompt and its parameters.
pub fn validate(prompt: &[u32], params: &GenerateParams, max_model_len: usize) -> Result<(), InvalidRequest> {
    if prompt.is_empty() {
        return Err(InvalidRequest::EmptyPrompt);
    }
    if prompt.len() >= max_model_len {
        return Err(InvalidRequest::PromptTooLong {
            tokens: prompt.len(),
            max_model_len,
        });
    }
    if params.max_tokens == 0 {
        return Err(InvalidRequest::NoTokens);
    }
    params.sampling.validate()?;
    Ok(())
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
        /// This request's verifications.
        spec_stats: SpecStats,
    },
    /// The request failed; no more events follow.
    Failed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was sampled.
    Stop,
    /// One of the request's `stop_token_ids` was sampled.
    StopToken(u32),
    /// max_tokens or the model's length limit was reached.
    Length,
}

//! One generation stream: its tokens, what of it is cached, its blocks, drafts and stop rules.

use crate::sampler::{Sampler, SamplingParams};
use crate::spec_stats::SpecStats;

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

pub struct Sequence {
    /// Prompt followed by generated tokens.
    pub token_ids: Vec<u32>,
    pub num_prompt_tokens: usize,
    /// Leading tokens whose keys and values are in the target (and drafter) cache.
    pub num_cached: usize,
    pub block_table: Vec<u32>,
    /// Proposed continuation of `token_ids`, verified by the next step.
    pub drafts: Vec<u32>,
    pub params: GenerateParams,
    pub sampler: Sampler,
    pub finish: Option<FinishReason>,
    pub spec_stats: SpecStats,
}

impl Sequence {
    pub fn new(prompt: Vec<u32>, params: GenerateParams) -> Self {
        Self {
            num_prompt_tokens: prompt.len(),
            token_ids: prompt,
            num_cached: 0,
            block_table: Vec::new(),
            drafts: Vec::new(),
            sampler: Sampler::new(params.sampling.seed),
            params,
            finish: None,
            spec_stats: SpecStats::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    pub fn generated(&self) -> &[u32] {
        &self.token_ids[self.num_prompt_tokens..]
    }

    /// True while prompt tokens are still to be run through the target.
    pub fn in_prefill(&self) -> bool {
        self.num_cached < self.token_ids.len() && self.generated().is_empty()
    }

    /// Appends committed tokens in order, stopping at an end-of-sequence token (not kept),
    /// at max_tokens or at `max_len`.
    pub fn commit(&mut self, tokens: &[u32], eos: &[u32], max_len: usize) {
        for &t in tokens {
            if !self.params.ignore_eos && eos.contains(&t) {
                self.finish = Some(FinishReason::Stop);
                return;
            }
            self.token_ids.push(t);
            if self.generated().len() >= self.params.max_tokens || self.len() >= max_len {
                self.finish = Some(FinishReason::Length);
                return;
            }
        }
    }
}

//! One generation stream: its tokens, what of it is cached, its blocks, drafts and stop rules.

use crate::prefix_cache::BlockHash;
use crate::request::{FinishReason, GenerateParams, TokenOutput};
use crate::sampler::Sampler;
use crate::spec_stats::SpecStats;
use crate::structured::Cursor;
use candle_core::Tensor;
use peagle_models::DeviceIds;

pub struct Sequence {
    /// Prompt followed by generated tokens.
    pub token_ids: Vec<u32>,
    pub num_prompt_tokens: usize,
    /// Leading tokens whose keys and values are in the target (and drafter) cache.
    pub num_cached: usize,
    /// Leading positions whose drafter rows are in the cache (the drafter reads a position's
    /// target state once the token after it is committed, and may fall behind while
    /// speculation is suspended).
    pub num_drafted: usize,
    pub block_table: Vec<u32>,
    /// The prefix-cache hash of each full block of `token_ids`.
    pub block_hashes: Vec<BlockHash>,
    /// Prompt tokens taken from the prefix cache when it was first scheduled.
    pub cached_prompt_tokens: usize,
    /// Proposed continuation of `token_ids`, verified by the next step.
    pub drafts: Vec<u32>,
    /// Drafts still where the drafter left them on the device: the next verification window
    /// takes them there, and they move to `drafts` while the target runs (`read_drafts`).
    pub drafts_on_device: Option<DeviceIds>,
    pub params: GenerateParams,
    pub sampler: Sampler,
    pub finish: Option<FinishReason>,
    pub spec_stats: SpecStats,
    /// Whether this request may use speculative decoding at all.
    pub speculate: bool,
    /// Report log-probabilities with this many alternatives.
    pub logprobs: Option<usize>,
    /// Tokens committed since the owner last drained them.
    pub outputs: Vec<TokenOutput>,
    /// Report the prompt tokens' log-probabilities with this many alternatives.
    pub prompt_logprobs: Option<usize>,
    /// Prompt tokens scored since the owner last drained them.
    pub prompt_outputs: Vec<TokenOutput>,
    /// Prompt tokens scored so far: a prefill recomputed after preemption does not repeat them.
    pub prompt_scored: usize,
    /// Positions the drafter has not cached yet, left behind while speculation was suspended.
    pub drafter_backlog: Option<DrafterBacklog>,
    /// Seeds the chain of `block_hashes` (`Request::cache_salt`).
    pub cache_salt: Option<String>,
    /// Where the structured output stands after the generated tokens, if the request has one.
    pub structured: Option<Cursor>,
}

/// Target states the drafter still has to read, projected to its width
/// (`Proposer::project`): positions `start..start + rows`, where `rows` is the total row
/// count of `hidden`. Kept so that a suspended sequence costs no drafter work per step; when
/// drafting resumes, one drafter pass catches up.
#[derive(Debug, Clone)]
pub struct DrafterBacklog {
    pub start: usize,
    pub hidden: Vec<Tensor>,
}

impl Sequence {
    pub fn new(prompt: Vec<u32>, params: GenerateParams) -> Self {
        Self {
            num_prompt_tokens: prompt.len(),
            token_ids: prompt,
            num_cached: 0,
            num_drafted: 0,
            block_table: Vec::new(),
            block_hashes: Vec::new(),
            cached_prompt_tokens: 0,
            drafts: Vec::new(),
            drafts_on_device: None,
            sampler: Sampler::new(params.sampling.seed),
            structured: params.sampling.structured.as_ref().map(|s| s.start()),
            params,
            finish: None,
            spec_stats: SpecStats::default(),
            speculate: true,
            logprobs: None,
            outputs: Vec::new(),
            prompt_logprobs: None,
            prompt_outputs: Vec::new(),
            prompt_scored: 0,
            drafter_backlog: None,
            cache_salt: None,
        }
    }

    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    /// Drafts the next verification window holds, wherever they are.
    pub fn num_drafts(&self) -> usize {
        self.drafts_on_device.as_ref().map_or(self.drafts.len(), DeviceIds::len)
    }

    pub fn generated(&self) -> &[u32] {
        &self.token_ids[self.num_prompt_tokens..]
    }

    /// Where prefill stops: the whole prompt for a new sequence (its last row samples the
    /// first token); all but the last token for one recomputed after preemption, which then
    /// continues decoding from that token.
    pub fn prefill_end(&self) -> usize {
        if self.generated().is_empty() {
            self.len()
        } else {
            self.len() - 1
        }
    }

    /// Whether a prefill chunk ending at `end` completes a new prompt, so its last row samples.
    pub fn samples_after(&self, end: usize) -> bool {
        self.generated().is_empty() && end == self.len()
    }

    /// Whether prompt tokens are still to be scored (the request asked for their
    /// log-probabilities), so every prefill row needs logits.
    pub fn scores_prompt(&self) -> bool {
        self.prompt_logprobs.is_some() && self.prompt_scored < self.num_prompt_tokens
    }

    /// True while tokens before the decode point are still to be run through the target.
    pub fn in_prefill(&self) -> bool {
        self.num_cached < self.prefill_end()
    }

    /// Forgets the cache (after preemption): the next steps recompute it from the tokens.
    pub fn reset_cache(&mut self) {
        self.num_cached = 0;
        self.num_drafted = 0;
        self.drafts.clear();
        self.drafts_on_device = None;
        self.drafter_backlog = None;
    }

    /// Appends committed tokens in order, up to and including one that ends the sequence: an
    /// end-of-sequence or stop token (marked `stops`), or the one that reaches max_tokens or
    /// `max_len`.
    pub fn commit(&mut self, tokens: &[TokenOutput], eos: &[u32], max_len: usize) {
        for t in tokens {
            let finish = if !self.params.ignore_eos && eos.contains(&t.id) {
                Some(FinishReason::Stop)
            } else if self.params.stop_token_ids.contains(&t.id) {
                Some(FinishReason::StopToken(t.id))
            } else {
                None
            };
            self.token_ids.push(t.id);
            if let (Some(cursor), Some(s)) = (&mut self.structured, &self.params.sampling.structured) {
                *cursor = s.advance(cursor, t.id);
            }
            self.outputs.push(TokenOutput {
                stops: finish.is_some(),
                ..t.clone()
            });
            if finish.is_some() {
                self.finish = finish;
                return;
            }
            if self.generated().len() >= self.params.max_tokens || self.len() >= max_len {
                self.finish = Some(FinishReason::Length);
                return;
            }
        }
    }

    /// The tokens held back until `min_tokens` are generated.
    pub fn stop_ids(&self, eos: &[u32]) -> Vec<u32> {
        let eos = if self.params.ignore_eos { &[][..] } else { eos };
        [eos, &self.params.stop_token_ids].concat()
    }
}

//! One engine step for a set of sequences (DESIGN.md section 2): a single target forward over
//! every scheduled prefill chunk and verification window `[b, d1..dK]`, verification of each
//! window, then one drafting round for every sequence that needs new drafts.

use crate::block_manager::BlockManager;
use crate::generator::GenerateError;
use crate::penalties::adjusted_rows;
use crate::proposer::{DraftRequest, Eagle3Proposer, NoProposer, PEagleProposer, Proposer};
use crate::sequence::{DrafterBacklog, Sequence, TokenOutput};
use crate::spec_stats::SpecStats;
use crate::step_times::StepTimes;
use crate::verifier::verify;
use candle_core::{DType, Tensor};
use peagle_kernels::on_pool;
use peagle_models::{BatchBuilder, Drafter, KvCache, Rows, TargetModel};
use std::time::Instant;

/// What a step does for one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Run the next `n` prompt tokens through the target.
    Prefill(usize),
    /// Verify the drafts after the last token (a window of one token without drafts).
    Decode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// Drafts per step.
    pub k: usize,
    /// One P-EAGLE pass for all K drafts instead of K EAGLE-3 passes.
    pub parallel: bool,
}

/// The paged KV caches, the target's and the drafter's alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    pub num_blocks: usize,
    pub block_size: usize,
    /// f32 or bf16.
    pub dtype: DType,
}

impl CacheConfig {
    /// Blocks one sequence can come to need: `max_model_len` tokens, then a verification
    /// window of `k` drafts and the drafter's look-ahead past it.
    pub fn blocks_per_sequence(max_model_len: usize, k: usize, block_size: usize) -> usize {
        (max_model_len + 2 * k).div_ceil(block_size)
    }
}

pub struct ModelRunner {
    target: Box<dyn TargetModel>,
    kv: KvCache,
    proposer: Box<dyn Proposer>,
    blocks: BlockManager,
    eos_token_ids: Vec<u32>,
    max_model_len: usize,
    stats: SpecStats,
    times: StepTimes,
}

/// A drafting round's input for one scheduled sequence, gathered while sequences are updated.
struct DraftPlan {
    index: usize,
    start: usize,
    tokens: Vec<u32>,
    hidden: Tensor,
    draft: bool,
}

impl ModelRunner {
    pub fn new(
        mut target: Box<dyn TargetModel>,
        drafter: Option<(Drafter, SpeculativeConfig)>,
        eos_token_ids: Vec<u32>,
        max_model_len: usize,
        cache: CacheConfig,
    ) -> Result<Self, GenerateError> {
        let device = target.device().clone();
        let proposer: Box<dyn Proposer> = match drafter {
            None => Box::new(NoProposer),
            Some((_, spec)) if spec.k == 0 => {
                return Err(GenerateError::Config(
                    "--k must be at least 1 with a draft model".into(),
                ))
            }
            Some((d, spec)) => {
                let kv = KvCache::new(d.dims(), cache.num_blocks, cache.block_size, cache.dtype, &device)?;
                if spec.parallel {
                    Box::new(PEagleProposer::new(d, spec.k, kv)?)
                } else {
                    Box::new(Eagle3Proposer::new(d, spec.k, kv))
                }
            }
        };
        if cache.block_size == 0 {
            return Err(GenerateError::Config(
                "the KV cache block size must be at least 1".into(),
            ));
        }
        let needed = CacheConfig::blocks_per_sequence(max_model_len, proposer.k(), cache.block_size);
        if cache.num_blocks < needed {
            // vLLM refuses to start here too: a sequence that outgrows the whole cache could
            // only preempt itself and start over, forever.
            return Err(GenerateError::Config(format!(
                "a KV cache of {} blocks of {} tokens cannot hold one sequence of the maximum \
                 length ({max_model_len} tokens, {} drafts): that takes {needed} blocks; raise \
                 the block count (--kv-cache-blocks) or lower the maximum length (--max-model-len)",
                cache.num_blocks,
                cache.block_size,
                proposer.k()
            )));
        }
        if proposer.k() > 0 {
            target.set_capture_layers(proposer.aux_layer_ids().to_vec())?;
        }
        Ok(Self {
            kv: KvCache::new(target.dims(), cache.num_blocks, cache.block_size, cache.dtype, &device)?,
            target,
            proposer,
            blocks: BlockManager::new(cache.num_blocks, cache.block_size),
            eos_token_ids,
            max_model_len,
            stats: SpecStats::default(),
            times: StepTimes::default(),
        })
    }

    pub fn k(&self) -> usize {
        self.proposer.k()
    }

    pub fn target(&self) -> &dyn TargetModel {
        self.target.as_ref()
    }

    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    pub fn stats(&self) -> &SpecStats {
        &self.stats
    }

    pub fn times(&self) -> &StepTimes {
        &self.times
    }

    /// Counts a finished step that took `seconds` in all; what its phases did not take goes
    /// to `other_seconds`.
    pub fn record_step(&mut self, seconds: f64, phases_before: f64) {
        self.times.steps += 1;
        self.times.other_seconds += (seconds - (self.times.phases() - phases_before)).max(0.0);
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Frees a sequence's blocks (finished, cancelled or preempted).
    pub fn release(&mut self, seq: &mut Sequence) {
        self.blocks.release(&mut seq.block_table);
    }

    /// Positions `work` touches for `seq`: its target rows plus the drafter's look-ahead.
    pub fn tokens_needed(&self, seq: &Sequence, work: Work) -> usize {
        let (start, rows) = span(seq, work);
        start + rows + self.proposer.lookahead()
    }

    /// Runs one step, proposing `k` (at most `self.k()`) drafts per sequence. With `k` = 0 the
    /// drafter does not run: the target states it would read are kept, and the next step that
    /// drafts catches the drafter up in the same pass.
    ///
    /// The whole step runs on the kernels' thread pool (`on_pool`): one hand-over per step
    /// instead of one per forward pass.
    pub fn step(&mut self, work: &mut [(&mut Sequence, Work)], k: usize) -> Result<(), GenerateError> {
        on_pool(|| self.step_on_worker(work, k))
    }

    fn step_on_worker(&mut self, work: &mut [(&mut Sequence, Work)], k: usize) -> Result<(), GenerateError> {
        let speculate = k > 0;
        let mut batch = BatchBuilder::new(self.kv.block_size());
        let mut placed = Vec::with_capacity(work.len());
        for (seq, w) in work.iter_mut() {
            if *w == Work::Decode && seq.num_cached + 1 != seq.len() {
                return Err(GenerateError::Config(format!(
                    "decode scheduled with {} of {} tokens cached",
                    seq.num_cached,
                    seq.len()
                )));
            }
            let needed = self.tokens_needed(seq, *w);
            self.blocks.grow(&mut seq.block_table, needed)?;
            let (start, rows) = span(seq, *w);
            let tokens = match w {
                Work::Prefill(_) => seq.token_ids[start..start + rows].to_vec(),
                Work::Decode => [&seq.token_ids[start..], &seq.drafts[..]].concat(),
            };
            let logits = match w {
                Work::Prefill(_) if seq.prompt_logprobs.is_some() && seq.prompt_scored < seq.num_prompt_tokens => {
                    Rows::All
                }
                Work::Prefill(_) if samples(seq, start + rows) => Rows::Tail(1),
                Work::Prefill(_) => Rows::None,
                Work::Decode => Rows::All,
            };
            // Only a sequence that drafts needs the target's hidden states.
            let capture = if self.drafts_for(seq) { Rows::All } else { Rows::None };
            placed.push(batch.add(&tokens, start, &seq.block_table, logits, capture)?);
        }
        let started = Instant::now();
        let out = self.target.forward(&batch.build(), &self.kv)?;
        let logits: Vec<Vec<f32>> = out.logits.to_vec2()?;
        self.times.target_seconds += started.elapsed().as_secs_f64();
        let started = Instant::now();

        let mut plans = Vec::new();
        for (index, ((seq, w), rows)) in work.iter_mut().zip(&placed).enumerate() {
            let (start, n) = span(seq, *w);
            if let Work::Prefill(_) = w {
                score_prompt(seq, start, &logits[rows.logits.clone()]);
            }
            // Each arm commits, then says how many leading target rows gave committed tokens
            // (the drafter's new slots) and whether drafts are wanted.
            let (hidden_rows, draft) = match w {
                Work::Prefill(_) if !samples(seq, start + n) => {
                    seq.num_cached = start + n;
                    (n, false)
                }
                Work::Prefill(_) => {
                    let row = std::slice::from_ref(&logits[rows.logits.end - 1]);
                    let adjusted = adjusted_rows(seq, &[], row, &self.eos_token_ids);
                    let token = verify(&[], &adjusted, None, &seq.params.sampling, &seq.sampler, seq.len());
                    seq.num_cached = seq.len();
                    let outputs = token_outputs(&token.tokens, row, seq.logprobs);
                    seq.commit(&outputs, &self.eos_token_ids, self.max_model_len);
                    (n, speculate)
                }
                Work::Decode => {
                    let drafts = std::mem::take(&mut seq.drafts);
                    let window = &logits[rows.logits.clone()];
                    let adjusted = adjusted_rows(seq, &drafts, window, &self.eos_token_ids);
                    let verdict = verify(&drafts, &adjusted, None, &seq.params.sampling, &seq.sampler, start + 1);
                    seq.spec_stats.record(drafts.len(), verdict.accepted);
                    self.stats.record(drafts.len(), verdict.accepted);
                    seq.num_cached = start + verdict.accepted + 1;
                    let outputs = token_outputs(&verdict.tokens, window, seq.logprobs);
                    seq.commit(&outputs, &self.eos_token_ids, self.max_model_len);
                    (verdict.accepted + 1, speculate)
                }
            };
            if !self.drafts_for(seq) || seq.finish.is_some() {
                continue;
            }
            let aux = out
                .aux_hidden
                .as_ref()
                .ok_or_else(|| GenerateError::Config("the target returned no hidden states for the drafter".into()))?;
            let hidden = aux.narrow(0, rows.captured.start, hidden_rows)?;
            let mut backlog = seq.drafter_backlog.take().unwrap_or(DrafterBacklog {
                start,
                hidden: Vec::new(),
            });
            backlog.hidden.push(hidden);
            if !speculate {
                seq.drafter_backlog = Some(backlog);
                continue;
            }
            // Slot p holds the token after position p; all of them are committed by now.
            let end = start + hidden_rows;
            plans.push(DraftPlan {
                index,
                start: backlog.start,
                tokens: seq.token_ids[backlog.start + 1..=end].to_vec(),
                hidden: Tensor::cat(&backlog.hidden, 0)?,
                draft,
            });
        }
        self.times.verify_seconds += started.elapsed().as_secs_f64();
        let started = Instant::now();
        self.draft(work, plans, k)?;
        self.times.drafter_seconds += started.elapsed().as_secs_f64();
        for (seq, _) in work.iter_mut() {
            let keep = if seq.finish.is_some() { 0 } else { seq.len() };
            // Roll back: blocks past the committed tokens held only rejected drafts.
            self.blocks.shrink(&mut seq.block_table, keep);
        }
        Ok(())
    }

    /// Whether `seq` runs through the drafter at all.
    fn drafts_for(&self, seq: &Sequence) -> bool {
        self.k() > 0 && seq.speculate
    }

    fn draft(
        &mut self,
        work: &mut [(&mut Sequence, Work)],
        plans: Vec<DraftPlan>,
        k: usize,
    ) -> Result<(), GenerateError> {
        if plans.is_empty() {
            return Ok(());
        }
        let requests: Vec<DraftRequest> = plans
            .iter()
            .map(|p| DraftRequest {
                tokens: &p.tokens,
                start: p.start,
                hidden: p.hidden.clone(),
                block_table: &work[p.index].0.block_table,
                draft: p.draft,
            })
            .collect();
        let drafts = self.proposer.propose(&requests, k)?;
        for (plan, d) in plans.iter().zip(drafts) {
            if plan.draft {
                work[plan.index].0.drafts = d;
            }
        }
        Ok(())
    }
}

/// First position and number of target rows of `work`.
fn span(seq: &Sequence, work: Work) -> (usize, usize) {
    match work {
        Work::Prefill(n) => (seq.num_cached, n.min(seq.prefill_end() - seq.num_cached)),
        Work::Decode => (seq.len() - 1, 1 + seq.drafts.len()),
    }
}

/// Whether a prefill chunk ending at `end` completes a new prompt, so its last row samples.
fn samples(seq: &Sequence, end: usize) -> bool {
    seq.generated().is_empty() && end == seq.len()
}

/// Scores the prompt tokens a prefill chunk at `start` has logits for: row i predicts the
/// token at `start + i + 1`. The first prompt token, which nothing predicts, gets no
/// log-probability. Rows are only there when the sequence asked for prompt log-probabilities.
fn score_prompt(seq: &mut Sequence, start: usize, rows: &[Vec<f32>]) {
    let Some(top) = seq.prompt_logprobs else { return };
    if seq.prompt_scored >= seq.num_prompt_tokens {
        return;
    }
    if seq.prompt_scored == 0 {
        seq.prompt_outputs.push(TokenOutput {
            id: seq.token_ids[0],
            logprob: None,
            top_logprobs: Vec::new(),
            stops: false,
        });
        seq.prompt_scored = 1;
    }
    let from = seq.prompt_scored;
    let end = (start + rows.len() + 1).min(seq.num_prompt_tokens);
    if end > from {
        let scored = token_outputs(&seq.token_ids[from..end], &rows[from - start - 1..], Some(top));
        seq.prompt_outputs.extend(scored);
        seq.prompt_scored = end;
    }
}

/// Committed tokens with their log-probabilities from the rows that produced them.
fn token_outputs(tokens: &[u32], rows: &[Vec<f32>], logprobs: Option<usize>) -> Vec<TokenOutput> {
    tokens
        .iter()
        .zip(rows)
        .map(|(&id, row)| match logprobs {
            None => TokenOutput {
                id,
                logprob: None,
                top_logprobs: Vec::new(),
                stops: false,
            },
            Some(top) => {
                let lp = log_softmax(row);
                let mut order: Vec<usize> = (0..lp.len()).collect();
                let top = top.min(lp.len());
                if top > 0 {
                    order.select_nth_unstable_by(top - 1, |a, b| lp[*b].total_cmp(&lp[*a]).then(a.cmp(b)));
                }
                order.truncate(top);
                order.sort_by(|a, b| lp[*b].total_cmp(&lp[*a]).then(a.cmp(b)));
                TokenOutput {
                    id,
                    logprob: Some(lp[id as usize]),
                    top_logprobs: order.into_iter().map(|i| (i as u32, lp[i])).collect(),
                    stops: false,
                }
            }
        })
        .collect()
}

fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = row.iter().map(|x| ((x - max) as f64).exp()).sum::<f64>().ln() as f32;
    row.iter().map(|x| x - max - log_sum).collect()
}

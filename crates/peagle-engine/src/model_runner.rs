//! One engine step for a set of sequences (DESIGN.md section 2): a single target forward over
//! every scheduled prefill chunk and verification window `[b, d1..dK]`, verification of each
//! window, then one drafting round for every sequence that needs new drafts.

use crate::block_manager::BlockManager;
use crate::generator::GenerateError;
use crate::logprobs::score_prompt;
use crate::proposer::{DraftRequest, Eagle3Proposer, NoProposer, PEagleProposer, Proposer};
use crate::rejection_sampler::{rejection_sample, Verified, Window};
use crate::sequence::{DrafterBacklog, Sequence};
use crate::spec_stats::SpecStats;
use crate::step_times::StepTimes;
use candle_core::{DType, Tensor};
use peagle_kernels::on_pool;
use peagle_models::{BatchBuilder, CausalLm, Drafter, KvCache, Rows, SequenceRows};
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
    target: CausalLm,
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
        mut target: CausalLm,
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

    pub fn target(&self) -> &CausalLm {
        &self.target
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
        self.times.target_seconds += started.elapsed().as_secs_f64();
        let started = Instant::now();

        let windows: Vec<Window> = work
            .iter()
            .zip(&placed)
            .filter_map(|((seq, w), rows)| window(seq, *w, rows))
            .collect();
        let mut verified = rejection_sample(&out.logits, &windows, &self.eos_token_ids)?.into_iter();
        let mut plans = Vec::new();
        for (index, ((seq, w), rows)) in work.iter_mut().zip(&placed).enumerate() {
            let (start, n) = span(seq, *w);
            if let Work::Prefill(_) = w {
                score_prompt(seq, start, &out.logits, rows.logits.clone())?;
            }
            // Each arm commits, then says how many leading target rows gave committed tokens
            // (the drafter's new slots) and whether drafts are wanted.
            let (hidden_rows, draft) = match w {
                Work::Prefill(_) if !samples(seq, start + n) => {
                    seq.num_cached = start + n;
                    (n, false)
                }
                Work::Prefill(_) => {
                    let Verified { outputs, .. } = verified.next().expect("a verdict per window");
                    seq.num_cached = seq.len();
                    seq.commit(&outputs, &self.eos_token_ids, self.max_model_len);
                    (n, speculate)
                }
                Work::Decode => {
                    let drafts = std::mem::take(&mut seq.drafts);
                    let Verified { verdict, outputs } = verified.next().expect("a verdict per window");
                    seq.spec_stats.record(drafts.len(), verdict.accepted);
                    self.stats.record(drafts.len(), verdict.accepted);
                    seq.num_cached = start + verdict.accepted + 1;
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

/// The window `work` verifies for `seq` in the step's logits at `rows`, if it chooses tokens:
/// a decode step's, or the last row of a prefill that completes a new prompt.
fn window<'a>(seq: &'a Sequence, work: Work, rows: &SequenceRows) -> Option<Window<'a>> {
    let (start, n) = span(seq, work);
    let (first_row, drafts) = match work {
        Work::Prefill(_) if !samples(seq, start + n) => return None,
        Work::Prefill(_) => (rows.logits.end - 1, &[][..]),
        Work::Decode => (rows.logits.start, &seq.drafts[..]),
    };
    Some(Window {
        first_row,
        drafts,
        position: seq.len(),
        seq,
    })
}

/// Whether a prefill chunk ending at `end` completes a new prompt, so its last row samples.
fn samples(seq: &Sequence, end: usize) -> bool {
    seq.generated().is_empty() && end == seq.len()
}

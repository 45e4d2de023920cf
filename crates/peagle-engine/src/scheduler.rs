//! Continuous batching: each step, running sequences go first (oldest first), then waiting
//! requests are admitted while the token budget, the sequence limit and free KV blocks allow.
//! Long prompts are prefilled in chunks. When blocks run out, the newest running sequence is
//! preempted: its blocks are freed and it is recomputed later from its tokens; nothing is lost.
//!
//! The scheduler owns the KV block manager. It grows the block table of every sequence it
//! schedules before the step (to the positions the step writes, the drafter's look-ahead
//! included), and after the step rolls each table back to its committed tokens and frees the
//! blocks of sequences that finished or were cancelled.
//!
//! With prefix caching, a sequence being admitted first takes the cached blocks its tokens
//! start with (only blocks with drafter rows when it drafts) and prefills from there; after
//! every step, the full blocks a sequence has computed join the cache. A preempted sequence's
//! blocks stay cached, so its recompute mostly finds them again; but a drafting sequence
//! preempted while speculation was suspended finds only the blocks its drafter had read, as
//! the drafter's rows need the target's states of a recompute.

use crate::block_manager::BlockManager;
use crate::engine_metrics::EngineMetrics;
use crate::request::{Event, FinishReason};
use crate::sequence::Sequence;
use std::collections::VecDeque;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Most target rows (prefill tokens + verification windows) in one step.
    pub max_num_batched_tokens: usize,
    /// Above this many decoding sequences, speculation is off whatever the policy measures.
    pub max_speculative_batch: usize,
    /// Choose k per batch size from measured goodput; false: always the drafter's full K.
    pub adaptive_k: bool,
    /// Most requests waiting for admission before new ones are refused.
    pub max_waiting: usize,
    /// Reuse the KV of earlier sequences' identical prefixes (vLLM's automatic prefix caching).
    pub prefix_caching: bool,
}

impl SchedulerConfig {
    /// The most target rows a step runs when a verification window has `window` rows: the
    /// tokens per step, but always room for one window.
    pub fn step_rows(&self, window: usize) -> usize {
        self.max_num_batched_tokens.max(window)
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            max_speculative_batch: usize::MAX,
            adaptive_k: true,
            max_waiting: 256,
            prefix_caching: true,
        }
    }
}

/// What a step does for one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Run the next `n` prompt tokens through the target.
    Prefill(usize),
    /// Verify the drafts after the last token (a window of one token without drafts).
    Decode,
}

impl Work {
    /// First position and number of target rows of this work for `seq`.
    pub fn span(self, seq: &Sequence) -> (usize, usize) {
        match self {
            Self::Prefill(n) => (seq.num_cached, n.min(seq.prefill_end() - seq.num_cached)),
            Self::Decode => (seq.len() - 1, 1 + seq.num_drafts()),
        }
    }
}

/// A request inside the engine.
pub struct Entry {
    pub seq: Sequence,
    pub events: UnboundedSender<Event>,
    /// Whether `Event::Scheduled` was sent.
    pub scheduled: bool,
}

/// One step's work: indices into the running sequences, ascending, and what each does.
pub type Schedule = Vec<(usize, Work)>;

#[derive(Default)]
struct Counters {
    prompt_tokens: u64,
    generation_tokens: u64,
    finished_stop: u64,
    finished_length: u64,
    aborted: u64,
    preemptions: u64,
    /// Prompt tokens of newly scheduled requests, and those found in the prefix cache.
    prefix_queries: u64,
    prefix_hits: u64,
}

pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    /// Positions past a step's last target row that the drafter writes to its cache.
    lookahead: usize,
    /// Rows of a full verification window: a step's budget always holds one.
    window: usize,
    waiting: VecDeque<Entry>,
    running: Vec<Entry>,
    counters: Counters,
}

impl Scheduler {
    /// `max_k` drafts per step at most, each step's drafter pass writing `lookahead`
    /// positions past its sequence's target rows.
    pub fn new(config: SchedulerConfig, blocks: BlockManager, max_k: usize, lookahead: usize) -> Self {
        Self {
            config,
            blocks,
            lookahead,
            window: max_k + 1,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: Counters::default(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    pub fn add(&mut self, entry: Entry) {
        self.waiting.push_back(entry);
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// The running sequences, oldest first.
    pub fn running(&self) -> impl Iterator<Item = &Sequence> {
        self.running.iter().map(|e| &e.seq)
    }

    /// Chooses this step's work and grows the block tables for it; preempts the newest
    /// sequences when blocks run short.
    pub fn schedule(&mut self) -> Schedule {
        let mut budget = self.config.step_rows(self.window);
        let mut schedule = Vec::new();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i].seq;
            let work = if seq.in_prefill() {
                Work::Prefill(budget)
            } else {
                Work::Decode
            };
            let rows = work.span(seq).1;
            if rows > budget {
                i += 1;
                continue;
            }
            if !self.grow(i, work) {
                // Free blocks by preempting the newest sequence; if that is this one, it waits.
                // Alone, a sequence always fits: the cache holds one of full length.
                let victim = self.running.len() - 1;
                self.preempt(victim);
                if victim == i {
                    break;
                }
                continue;
            }
            budget -= rows;
            schedule.push((i, work));
            i += 1;
        }
        while self.running.len() < self.config.max_num_seqs && budget > 0 {
            let Some(mut entry) = self.waiting.pop_front() else {
                break;
            };
            let work = Work::Prefill(budget);
            if entry.seq.num_cached == 0 {
                self.reuse_prefix(&mut entry);
            }
            let needed = self.tokens_needed(&entry.seq, work);
            if self.blocks.grow(&mut entry.seq.block_table, needed).is_err() {
                // With nothing running every block is free, and any prompt fits then.
                self.blocks.release(&mut entry.seq.block_table);
                entry.seq.reset_cache();
                self.waiting.push_front(entry);
                break;
            }
            if !entry.scheduled {
                self.counters.prefix_queries += entry.seq.num_prompt_tokens as u64;
                self.counters.prefix_hits += entry.seq.num_cached as u64;
                entry.seq.cached_prompt_tokens = entry.seq.num_cached;
                entry.scheduled = true;
                let _ = entry.events.send(Event::Scheduled(Instant::now()));
            }
            budget -= work.span(&entry.seq).1;
            self.running.push(entry);
            schedule.push((self.running.len() - 1, work));
        }
        schedule
    }

    /// The scheduled sequences with their work, for the step to run.
    pub fn work(&mut self, schedule: &Schedule) -> Vec<(&mut Sequence, Work)> {
        let mut work = Vec::with_capacity(schedule.len());
        let mut pending = schedule.iter().peekable();
        for (i, entry) in self.running.iter_mut().enumerate() {
            if let Some((_, w)) = pending.next_if(|(j, _)| *j == i) {
                work.push((&mut entry.seq, *w));
            }
        }
        work
    }

    /// After a step that ran: caches the full blocks computed so far, rolls back the blocks
    /// that held only rejected drafts, sends committed tokens and finishes, and frees the
    /// sequences that left.
    pub fn finish_step(&mut self, schedule: &Schedule) {
        for (i, _) in schedule {
            let seq = &mut self.running[*i].seq;
            if self.blocks.cache().enabled() {
                // A sequence that finished inside a verification window counts accepted rows
                // past its last token as cached.
                let computed = seq.num_cached.min(seq.len());
                let drafted = seq.num_drafted.min(computed);
                self.blocks.cache().extend_hashes(
                    &mut seq.block_hashes,
                    &seq.token_ids[..computed],
                    self.blocks.block_size(),
                    seq.cache_salt.as_deref(),
                );
                self.blocks
                    .register(&seq.block_table, &seq.block_hashes, &seq.token_ids, computed, drafted);
            }
            let keep = if seq.finish.is_some() { 0 } else { seq.len() };
            self.blocks.shrink(&mut seq.block_table, keep);
        }
        self.emit();
    }

    /// Forgets every cached prefix; the blocks in use stay with their sequences.
    pub fn reset_prefix_cache(&mut self) {
        self.blocks.reset_cache();
    }

    /// After a step that failed: its sequences fail with `message` and leave.
    pub fn fail_step(&mut self, schedule: &Schedule, message: &str) {
        for (i, _) in schedule.iter().rev() {
            let mut entry = self.running.remove(*i);
            self.blocks.release(&mut entry.seq.block_table);
            let _ = entry.events.send(Event::Failed(message.to_owned()));
        }
    }

    /// Requests whose receiver is gone are cancelled and their blocks freed.
    pub fn drop_cancelled(&mut self) {
        let before = self.waiting.len() + self.running.len();
        self.waiting.retain(|e| !e.events.is_closed());
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].events.is_closed() {
                let mut entry = self.running.remove(i);
                self.blocks.release(&mut entry.seq.block_table);
            } else {
                i += 1;
            }
        }
        self.counters.aborted += (before - self.waiting.len() - self.running.len()) as u64;
    }

    pub fn fill_metrics(&self, m: &mut EngineMetrics) {
        m.running = self.running.len();
        m.waiting = self.waiting.len();
        m.kv_blocks_used = self.blocks.num_used();
        m.kv_blocks_total = self.blocks.num_blocks();
        m.prompt_tokens_total = self.counters.prompt_tokens;
        m.generation_tokens_total = self.counters.generation_tokens;
        m.requests_finished_stop = self.counters.finished_stop;
        m.requests_finished_length = self.counters.finished_length;
        m.requests_aborted = self.counters.aborted;
        m.preemptions_total = self.counters.preemptions;
        m.prefix_cache_queries = self.counters.prefix_queries;
        m.prefix_cache_hits = self.counters.prefix_hits;
        m.kv_blocks_cached_free = self.blocks.num_cached_free();
    }

    /// Starts a sequence with no cache on the cached blocks its tokens begin with, leaving
    /// at least one prefill row to compute. A request that scores its prompt computes it all.
    fn reuse_prefix(&mut self, entry: &mut Entry) {
        let seq = &mut entry.seq;
        if seq.scores_prompt() || !self.blocks.cache().enabled() {
            return;
        }
        let bs = self.blocks.block_size();
        self.blocks
            .cache()
            .extend_hashes(&mut seq.block_hashes, &seq.token_ids, bs, seq.cache_salt.as_deref());
        let drafter = self.window > 1 && seq.speculate;
        let keep_out = seq.len() - seq.prefill_end() + 1;
        let hit = self.blocks.lookup(&seq.block_hashes, &seq.token_ids, keep_out, drafter);
        self.blocks.share(&mut seq.block_table, &hit);
        seq.num_cached = hit.len() * bs;
        seq.num_drafted = if drafter { seq.num_cached } else { 0 };
    }

    /// Positions `work` touches for `seq`: its target rows plus the drafter's look-ahead.
    fn tokens_needed(&self, seq: &Sequence, work: Work) -> usize {
        let (start, rows) = work.span(seq);
        start + rows + self.lookahead
    }

    /// Grows running sequence `i`'s table for `work`; false (nothing allocated) when the
    /// free blocks do not suffice.
    fn grow(&mut self, i: usize, work: Work) -> bool {
        let needed = self.tokens_needed(&self.running[i].seq, work);
        self.blocks.grow(&mut self.running[i].seq.block_table, needed).is_ok()
    }

    fn preempt(&mut self, index: usize) {
        let mut entry = self.running.remove(index);
        self.blocks.release(&mut entry.seq.block_table);
        entry.seq.reset_cache();
        self.counters.preemptions += 1;
        tracing::debug!(tokens = entry.seq.len(), "preempted a sequence for recompute");
        self.waiting.push_front(entry);
    }

    /// Sends committed tokens and finishes; finished sequences leave the batch.
    fn emit(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let entry = &mut self.running[i];
            let scored = std::mem::take(&mut entry.seq.prompt_outputs);
            let mut alive = scored.is_empty() || entry.events.send(Event::PromptLogprobs(scored)).is_ok();
            let outputs = std::mem::take(&mut entry.seq.outputs);
            // Counted once its prefill is done: a prompt preempted halfway is not counted twice.
            if !outputs.is_empty() && entry.seq.generated().len() == outputs.len() {
                self.counters.prompt_tokens += entry.seq.num_prompt_tokens as u64;
            }
            self.counters.generation_tokens += outputs.len() as u64;
            alive &= outputs.is_empty() || entry.events.send(Event::Tokens(outputs)).is_ok();
            if let Some(reason) = entry.seq.finish {
                match reason {
                    FinishReason::Stop | FinishReason::StopToken(_) => self.counters.finished_stop += 1,
                    FinishReason::Length => self.counters.finished_length += 1,
                    FinishReason::Abort => self.counters.aborted += 1,
                }
                let _ = entry.events.send(Event::Finished {
                    reason,
                    prompt_tokens: entry.seq.num_prompt_tokens,
                    completion_tokens: entry.seq.generated().len(),
                    cached_tokens: entry.seq.cached_prompt_tokens,
                    spec_stats: entry.seq.spec_stats.clone(),
                });
                alive = false;
            }
            if alive {
                i += 1;
            } else {
                if entry.seq.finish.is_none() {
                    self.counters.aborted += 1;
                }
                let mut entry = self.running.remove(i);
                self.blocks.release(&mut entry.seq.block_table);
            }
        }
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;

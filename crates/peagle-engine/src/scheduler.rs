//! Continuous batching: each step, running sequences go first (oldest first), then waiting
//! requests are admitted while the token budget, the sequence limit and free KV blocks allow.
//! Long prompts are prefilled in chunks. When blocks run out, the newest running sequence is
//! preempted: its blocks are freed and it is recomputed later from its tokens; nothing is lost.
//!
//! Speculation under load: a verification window costs k + 1 target rows, so as the batch
//! grows drafts stop being free. The speculation policy picks k for each step from measured
//! goodput at the step's batch size (k = 0 turns speculation off); above
//! `max_speculative_batch` decoding sequences it is off regardless. While off, the drafter does
//! not run: each sequence keeps the target states it has not read, and one drafter pass catches
//! up when speculation resumes.

use crate::engine::{EngineMetrics, Event};
use crate::model_runner::{ModelRunner, Work};
use crate::sequence::{FinishReason, Sequence};
use crate::speculation_policy::{SpeculationPolicy, StepSample};
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
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            max_speculative_batch: usize::MAX,
            adaptive_k: true,
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

#[derive(Default)]
struct Counters {
    prompt_tokens: u64,
    generation_tokens: u64,
    finished_stop: u64,
    finished_length: u64,
    aborted: u64,
    preemptions: u64,
}

pub struct Scheduler {
    config: SchedulerConfig,
    waiting: VecDeque<Entry>,
    running: Vec<Entry>,
    counters: Counters,
    policy: Option<SpeculationPolicy>,
    k_in_use: usize,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            counters: Counters::default(),
            policy: None,
            k_in_use: 0,
        }
    }

    pub fn add(&mut self, entry: Entry) {
        self.waiting.push_back(entry);
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// One engine step: drop cancelled requests, schedule, run, send events.
    pub fn step(&mut self, runner: &mut ModelRunner) {
        let step_started = Instant::now();
        let phases_before = runner.times().phases();
        self.drop_cancelled(runner);
        let plan = self.schedule(runner);
        if plan.is_empty() {
            return;
        }
        // This step's drafts are verified next step, by every running sequence: new prompts
        // included, so a burst of them does not run the drafter over prompts it will not use.
        let batch = self.running.len();
        let policy = self
            .policy
            .get_or_insert_with(|| SpeculationPolicy::new(runner.k(), self.config.adaptive_k));
        let k = if batch > self.config.max_speculative_batch {
            0
        } else {
            policy.choose(batch, runner.stats())
        };
        self.k_in_use = k;
        let mut work: Vec<(&mut Sequence, Work)> = Vec::with_capacity(plan.len());
        let mut planned = plan.iter().peekable();
        for (i, entry) in self.running.iter_mut().enumerate() {
            if let Some((_, w)) = planned.next_if(|(j, _)| *j == i) {
                work.push((&mut entry.seq, *w));
            }
        }
        let started = Instant::now();
        let drafter_before = runner.times().drafter_seconds;
        let result = runner.step(&mut work, k);
        let seconds = started.elapsed().as_secs_f64();
        let prefill = work.iter().any(|(_, w)| matches!(w, Work::Prefill(_)));
        let sample = StepSample {
            batch: work.len(),
            k,
            seconds,
            decode_only: !prefill && work.len() == batch,
            prefill_drafter_seconds: if prefill {
                runner.times().drafter_seconds - drafter_before
            } else {
                0.0
            },
            tokens: work.iter().map(|(seq, _)| seq.outputs.len()).sum(),
        };
        tracing::trace!(?sample, "engine step");
        policy.observe(sample);
        if let Err(e) = result {
            tracing::error!(error = %e, "engine step failed");
            let message = format!("engine step failed: {e}");
            for (i, _) in plan.iter().rev() {
                let mut entry = self.running.remove(*i);
                runner.release(&mut entry.seq);
                let _ = entry.events.send(Event::Failed(message.clone()));
            }
            return;
        }
        self.emit(runner);
        runner.record_step(step_started.elapsed().as_secs_f64(), phases_before);
    }

    /// Chooses this step's work; preempts the newest sequences when blocks run short.
    fn schedule(&mut self, runner: &mut ModelRunner) -> Vec<(usize, Work)> {
        // At least one full verification window must fit, or decoding could never be scheduled.
        let mut budget = self.config.max_num_batched_tokens.max(runner.k() + 1);
        let mut free = runner.blocks().num_free();
        let mut plan = Vec::new();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i].seq;
            let work = if seq.in_prefill() {
                Work::Prefill(budget)
            } else {
                Work::Decode
            };
            let rows = rows_of(seq, work);
            if rows > budget {
                i += 1;
                continue;
            }
            let need = blocks_needed(runner, seq, work);
            if need > free {
                // Free blocks by preempting the newest sequence; if that is this one, it waits.
                // Alone, a sequence always fits: the runner's cache holds one of full length.
                let victim = self.running.len() - 1;
                let victim_free = self.running[victim].seq.block_table.len();
                self.preempt(runner, victim);
                if victim == i {
                    break;
                }
                free += victim_free;
                continue;
            }
            free -= need;
            budget -= rows;
            plan.push((i, work));
            i += 1;
        }
        while self.running.len() < self.config.max_num_seqs && budget > 0 {
            let Some(entry) = self.waiting.front() else { break };
            let work = Work::Prefill(budget);
            let need = blocks_needed(runner, &entry.seq, work);
            if need > free {
                // With nothing running every block is free, and any prompt fits then.
                break;
            }
            let mut entry = self.waiting.pop_front().expect("front exists");
            if !entry.scheduled {
                entry.scheduled = true;
                let _ = entry.events.send(Event::Scheduled(Instant::now()));
            }
            free -= need;
            budget -= rows_of(&entry.seq, work);
            self.running.push(entry);
            plan.push((self.running.len() - 1, work));
        }
        plan
    }

    fn preempt(&mut self, runner: &mut ModelRunner, index: usize) {
        let mut entry = self.running.remove(index);
        runner.release(&mut entry.seq);
        entry.seq.reset_cache();
        self.counters.preemptions += 1;
        tracing::debug!(tokens = entry.seq.len(), "preempted a sequence for recompute");
        self.waiting.push_front(entry);
    }

    /// Sends committed tokens and finishes; finished sequences leave the batch.
    fn emit(&mut self, runner: &mut ModelRunner) {
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
                }
                let _ = entry.events.send(Event::Finished {
                    reason,
                    prompt_tokens: entry.seq.num_prompt_tokens,
                    completion_tokens: entry.seq.generated().len(),
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
                runner.release(&mut entry.seq);
            }
        }
    }

    /// Requests whose receiver is gone are cancelled and their blocks freed.
    fn drop_cancelled(&mut self, runner: &mut ModelRunner) {
        let before = self.waiting.len() + self.running.len();
        self.waiting.retain(|e| !e.events.is_closed());
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].events.is_closed() {
                let mut entry = self.running.remove(i);
                runner.release(&mut entry.seq);
            } else {
                i += 1;
            }
        }
        self.counters.aborted += (before - self.waiting.len() - self.running.len()) as u64;
    }

    pub fn fill_metrics(&self, runner: &ModelRunner, m: &mut EngineMetrics) {
        m.running = self.running.len();
        m.waiting = self.waiting.len();
        m.kv_blocks_used = runner.blocks().num_used();
        m.kv_blocks_total = runner.blocks().num_blocks();
        m.prompt_tokens_total = self.counters.prompt_tokens;
        m.generation_tokens_total = self.counters.generation_tokens;
        m.requests_finished_stop = self.counters.finished_stop;
        m.requests_finished_length = self.counters.finished_length;
        m.requests_aborted = self.counters.aborted;
        m.preemptions_total = self.counters.preemptions;
        m.spec = runner.stats().clone();
        m.k_in_use = self.k_in_use;
        m.step_times = runner.times().clone();
    }
}

fn rows_of(seq: &Sequence, work: Work) -> usize {
    match work {
        Work::Prefill(n) => n.min(seq.prefill_end() - seq.num_cached),
        Work::Decode => 1 + seq.drafts.len(),
    }
}

/// Blocks `work` adds to the sequence's table.
fn blocks_needed(runner: &ModelRunner, seq: &Sequence, work: Work) -> usize {
    runner
        .blocks()
        .blocks_for(runner.tokens_needed(seq, work))
        .saturating_sub(seq.block_table.len())
}

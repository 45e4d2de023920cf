//! The engine: all model state, advanced one step at a time. A step reads top to bottom:
//! schedule, run the target (whose windows take the last step's drafts on the device; the host
//! reads them while it runs), sample and verify, draft, then post-process (send tokens, roll
//! back and free blocks). `EngineHandle` runs it on a thread of its own for the server;
//! `Generator` steps it directly for one prompt at a time.
//!
//! Speculation under load: a verification window costs k + 1 target rows, so as the batch
//! grows drafts stop being free. The speculation policy picks k for each step from measured
//! goodput at the step's batch size (k = 0 turns speculation off); above
//! `max_speculative_batch` decoding sequences it is off regardless.

use crate::drafting::{read_drafts, Drafting};
use crate::engine_metrics::EngineMetrics;
use crate::model_runner::ModelRunner;
use crate::request::{Event, Request};
use crate::scheduler::{Entry, Schedule, Scheduler, Work};
use crate::sequence::Sequence;
use crate::spec_stats::SpecStats;
use crate::speculation_policy::{SpeculationPolicy, StepSample};
use crate::step_times::StepTimes;
use crate::verification::{issue_choices, sample_and_verify};
use crate::GenerateError;
use peagle_kernels::on_pool;
use peagle_models::TargetModel;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

pub struct Engine {
    scheduler: Scheduler,
    runner: ModelRunner,
    drafting: Drafting,
    policy: SpeculationPolicy,
    eos_token_ids: Vec<u32>,
    max_model_len: usize,
    k_in_use: usize,
    /// Whether the last step that ran waited for its drafter.
    last_waited: bool,
    stats: SpecStats,
    times: StepTimes,
}

impl Engine {
    /// Assembled by `EngineBuilder`, which checks that the parts fit together.
    pub(crate) fn new(
        scheduler: Scheduler,
        runner: ModelRunner,
        drafting: Drafting,
        eos_token_ids: Vec<u32>,
        max_model_len: usize,
    ) -> Self {
        let policy = SpeculationPolicy::new(drafting.k(), scheduler.config().adaptive_k);
        Self {
            scheduler,
            runner,
            drafting,
            policy,
            eos_token_ids,
            max_model_len,
            k_in_use: 0,
            last_waited: false,
            stats: SpecStats::default(),
            times: StepTimes::default(),
        }
    }

    /// Most drafts per step (0 without a drafter).
    pub fn k(&self) -> usize {
        self.drafting.k()
    }

    pub fn num_blocks(&self) -> usize {
        self.scheduler.blocks().num_blocks()
    }

    /// Most requests waiting for admission before new ones are refused.
    pub fn max_waiting(&self) -> usize {
        self.scheduler.config().max_waiting
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    pub fn target(&self) -> &dyn TargetModel {
        self.runner.target()
    }

    pub fn stats(&self) -> &SpecStats {
        &self.stats
    }

    pub fn times(&self) -> &StepTimes {
        &self.times
    }

    pub fn is_idle(&self) -> bool {
        self.scheduler.is_idle()
    }

    /// Queues a validated request; its events go to `events`.
    pub fn add(&mut self, request: Request, events: UnboundedSender<Event>) {
        let mut seq = Sequence::new(request.prompt, request.params);
        seq.speculate = request.speculate;
        seq.logprobs = request.logprobs;
        seq.prompt_logprobs = request.prompt_logprobs;
        seq.cache_salt = request.cache_salt;
        self.scheduler.add(Entry {
            seq,
            events,
            scheduled: false,
        });
    }

    /// One engine step over every running and admitted sequence.
    pub fn step(&mut self) {
        self.step_at(None);
    }

    /// A step with `forced_k` drafts per sequence, or the policy's choice.
    fn step_at(&mut self, forced_k: Option<usize>) {
        let step_started = Instant::now();
        let phases_before = self.times.phases();
        self.scheduler.drop_cancelled();
        let schedule = self.scheduler.schedule();
        if schedule.is_empty() {
            return;
        }
        let k = forced_k.unwrap_or_else(|| self.choose_k());
        let started = Instant::now();
        let drafter_before = self.times.drafter_seconds;
        // A GPU runs a step's drafter while the host goes on to the next step, whose forward
        // waits for it: a steady decode step's drafter time is charged to the next one's
        // target, alike from step to step. A step unlike its next waits for its drafter
        // instead: one with prefill work, so that the policy charges a prompt's drafter pass
        // to drafting; the first at a new k, whose drafter catches up after a suspension; and
        // one at k = 0, whose drafter runs only for finishing sequences' last states. The
        // policy does not time a drafting step after a wait (`StepSample::after_drafter_wait`).
        let wait = runs_prefill(&schedule) || self.policy.previous_k() != Some(k) || k == 0;
        let result = self.run(&schedule, k, wait);
        self.observe(&schedule, k, started.elapsed().as_secs_f64(), drafter_before);
        self.last_waited = wait;
        match result {
            Ok(()) => self.scheduler.finish_step(&schedule),
            Err(e) => {
                tracing::error!(error = %e, "engine step failed");
                self.scheduler.fail_step(&schedule, &format!("engine step failed: {e}"));
                return;
            }
        }
        self.times.steps += 1;
        let seconds = step_started.elapsed().as_secs_f64();
        self.times.other_seconds += (seconds - (self.times.phases() - phases_before)).max(0.0);
    }

    /// Forgets every cached prefix (`POST /reset_prefix_cache`).
    pub fn reset_prefix_cache(&mut self) {
        self.scheduler.reset_prefix_cache();
    }

    pub fn fill_metrics(&self, m: &mut EngineMetrics) {
        self.scheduler.fill_metrics(m);
        m.spec = self.stats.clone();
        m.k_in_use = self.k_in_use;
        m.step_times = self.times.clone();
    }

    /// This step's drafts are verified next step, by every running sequence: new prompts
    /// included, so a burst of them does not run the drafter over prompts it will not use.
    fn choose_k(&mut self) -> usize {
        let batch = self.scheduler.num_running();
        self.k_in_use = if batch > self.scheduler.config().max_speculative_batch {
            0
        } else {
            self.policy.choose(batch, &self.stats)
        };
        self.k_in_use
    }

    /// The model work of a step, on the kernels' thread pool (one hand-over per step instead
    /// of one per forward pass): the target forward, verification, then drafting.
    /// `wait`: the host waits for the drafter's kernels before it returns.
    fn run(&mut self, schedule: &Schedule, k: usize, wait: bool) -> Result<(), GenerateError> {
        let mut work = self.scheduler.work(schedule);
        let (runner, drafting) = (&self.runner, &mut self.drafting);
        let (stats, times) = (&mut self.stats, &mut self.times);
        let (eos, max_len) = (&self.eos_token_ids, self.max_model_len);
        on_pool(|| {
            let started = Instant::now();
            let target = runner.run(&work, |seq| drafting.drafts_for(seq))?;
            let logits = &target.forward.logits;
            // Issued behind the forward, the device's choices of its rows and the drafter's
            // projection of its captured states are done when the host first waits, for the
            // drafts or the forward: one wait for all. A graph's captured states lie in its
            // outputs, which its next replay overwrites: projected now, they are read first.
            let choices = issue_choices(&work, logits, &target.rows)?;
            let states = drafting.project(target.forward.aux_hidden.as_ref())?;
            read_drafts(&mut work)?;
            // A GPU runs the forward's kernels after their launch returns: waiting for them
            // here charges them (and the choices and projection issued behind them) to the
            // target, not to the verification that reads their results, and costs nothing that
            // verification would not wait for.
            logits.device().synchronize()?;
            times.target_seconds += started.elapsed().as_secs_f64();

            let started = Instant::now();
            let committed = sample_and_verify(&mut work, choices, logits, &target.rows, eos, max_len, stats)?;
            times.verify_seconds += started.elapsed().as_secs_f64();

            let started = Instant::now();
            drafting.run(&mut work, states.as_ref(), &target.rows, &committed, k)?;
            // Without a drafter there is nothing to wait for.
            if wait && drafting.k() > 0 {
                logits.device().synchronize()?;
            }
            times.drafter_seconds += started.elapsed().as_secs_f64();
            Ok(())
        })
    }

    /// Feeds the speculation policy what the step cost.
    fn observe(&mut self, schedule: &Schedule, k: usize, seconds: f64, drafter_before: f64) {
        let prefill = runs_prefill(schedule);
        let running = self.scheduler.num_running();
        let work = self.scheduler.work(schedule);
        let sample = StepSample {
            batch: schedule.len(),
            k,
            seconds,
            decode_only: !prefill && schedule.len() == running,
            prefill_drafter_seconds: if prefill {
                self.times.drafter_seconds - drafter_before
            } else {
                0.0
            },
            after_drafter_wait: self.last_waited,
            tokens: work.iter().map(|(seq, _)| seq.outputs.len()).sum(),
        };
        tracing::trace!(?sample, "engine step");
        self.policy.observe(sample);
    }
}

/// Whether a step runs prefill work (a prompt chunk) besides decoding.
fn runs_prefill(schedule: &Schedule) -> bool {
    schedule.iter().any(|(_, w)| matches!(w, Work::Prefill(_)))
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;

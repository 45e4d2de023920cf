//! The serving engine (DESIGN.md section 2): a thread of its own owns the model runner and
//! all model state. Requests arrive over a channel; each gets its own channel of events.
//! Dropping a request's event receiver cancels it and frees its KV blocks.

use crate::model_runner::ModelRunner;
use crate::scheduler::{Entry, Scheduler, SchedulerConfig};
pub use crate::sequence::TokenOutput;
use crate::sequence::{FinishReason, GenerateParams, Sequence};
use crate::spec_stats::SpecStats;
use crate::step_times::StepTimes;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use thiserror::Error;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

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
    },
    /// The request failed; no more events follow.
    Failed(String),
}

#[derive(Debug, Error, PartialEq)]
pub enum SubmitError {
    /// Bad request: the message says what is wrong.
    #[error("{0}")]
    Invalid(String),
    #[error("the server is busy: {waiting} requests are waiting (limit {limit}); retry later")]
    QueueFull { waiting: usize, limit: usize },
    #[error("the server is shutting down")]
    ShuttingDown,
}

/// Counters for /metrics; a snapshot is cheap to take.
#[derive(Debug, Clone, Default)]
pub struct EngineMetrics {
    pub running: usize,
    pub waiting: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub requests_finished_stop: u64,
    pub requests_finished_length: u64,
    pub requests_aborted: u64,
    pub preemptions_total: u64,
    pub spec: SpecStats,
    /// Drafts per step in use now (0 when speculation is off or suspended under load).
    pub k_in_use: usize,
    pub step_times: StepTimes,
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub scheduler: SchedulerConfig,
    /// Most requests waiting for admission before new ones are refused.
    pub max_waiting: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            scheduler: SchedulerConfig::default(),
            max_waiting: 256,
        }
    }
}

enum Command {
    Submit(Box<Entry>),
    Shutdown,
}

/// What the engine thread publishes and the handles read, under one lock.
struct Shared {
    metrics: EngineMetrics,
    /// Requests submitted that the engine has not published as taken from its inbox. They
    /// count in `metrics.waiting`: the engine's own count would leave them out until then,
    /// and let a full queue take more.
    in_transit: usize,
}

/// The way in: cheap to clone, usable from any thread or task.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    shared: Arc<Mutex<Shared>>,
    max_model_len: usize,
    max_waiting: usize,
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn start(runner: ModelRunner, config: EngineConfig) -> Self {
        let (commands, inbox) = mpsc::channel();
        let shared = Arc::new(Mutex::new(Shared {
            metrics: EngineMetrics {
                kv_blocks_total: runner.blocks().num_blocks(),
                ..Default::default()
            },
            in_transit: 0,
        }));
        let handle = Self {
            commands,
            shared: shared.clone(),
            max_model_len: runner.max_model_len(),
            max_waiting: config.max_waiting,
        };
        let scheduler = Scheduler::new(config.scheduler);
        std::thread::Builder::new()
            .name("peagle-engine".into())
            .spawn(move || {
                EngineLoop {
                    runner,
                    scheduler,
                    inbox,
                    shared,
                    taken: 0,
                    accepting: true,
                }
                .run()
            })
            .expect("spawning the engine thread");
        handle
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Queues a request; its events arrive on the returned receiver.
    pub fn submit(&self, request: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        Ok(self.submit_all(vec![request])?.remove(0))
    }

    /// Queues requests that belong together (the choices of one response), all or none. The
    /// queue limit is checked once: a response with more choices than the limit still gets in
    /// while the queue is below it, where a check per choice would refuse it forever.
    pub fn submit_all(&self, requests: Vec<Request>) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError> {
        for r in &requests {
            validate(r, self.max_model_len)?;
        }
        let count = requests.len();
        {
            let mut shared = self.shared.lock().expect("metrics lock");
            let waiting = shared.metrics.waiting;
            if waiting >= self.max_waiting {
                return Err(SubmitError::QueueFull {
                    waiting,
                    limit: self.max_waiting,
                });
            }
            shared.metrics.waiting += count;
            shared.in_transit += count;
        }
        let mut receivers = Vec::with_capacity(count);
        for (sent, request) in requests.into_iter().enumerate() {
            let (tx, rx) = unbounded_channel();
            let mut seq = Sequence::new(request.prompt, request.params);
            seq.speculate = request.speculate;
            seq.logprobs = request.logprobs;
            seq.prompt_logprobs = request.prompt_logprobs;
            let entry = Entry {
                seq,
                events: tx,
                scheduled: false,
            };
            if self.commands.send(Command::Submit(Box::new(entry))).is_err() {
                let mut shared = self.shared.lock().expect("metrics lock");
                shared.metrics.waiting -= count - sent;
                shared.in_transit -= count - sent;
                return Err(SubmitError::ShuttingDown);
            }
            receivers.push(rx);
        }
        Ok(receivers)
    }

    pub fn metrics(&self) -> EngineMetrics {
        self.shared.lock().expect("metrics lock").metrics.clone()
    }

    /// Refuses new requests from now on; those already queued or running still finish.
    pub fn shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
    }
}

fn validate(r: &Request, max_model_len: usize) -> Result<(), SubmitError> {
    let invalid = |m: String| Err(SubmitError::Invalid(m));
    if r.prompt.is_empty() {
        return invalid("the prompt is empty".into());
    }
    if r.prompt.len() >= max_model_len {
        return invalid(format!(
            "the prompt has {} tokens but the model's context is {max_model_len} tokens",
            r.prompt.len()
        ));
    }
    if r.params.max_tokens == 0 {
        return invalid("max_tokens must be at least 1".into());
    }
    r.params
        .sampling
        .validate()
        .map_err(|e| SubmitError::Invalid(e.to_string()))
}

struct EngineLoop {
    runner: ModelRunner,
    scheduler: Scheduler,
    inbox: mpsc::Receiver<Command>,
    shared: Arc<Mutex<Shared>>,
    /// Submissions taken from the inbox since the last publish.
    taken: usize,
    accepting: bool,
}

impl EngineLoop {
    fn run(mut self) {
        loop {
            // Block while idle; otherwise take whatever has arrived and keep stepping.
            if self.scheduler.is_idle() {
                match self.inbox.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => return,
                }
            }
            while let Ok(cmd) = self.inbox.try_recv() {
                self.handle(cmd);
            }
            self.scheduler.step(&mut self.runner);
            self.publish();
            if !self.accepting && self.scheduler.is_idle() {
                return;
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        if let Command::Submit(_) = cmd {
            self.taken += 1;
        }
        match cmd {
            Command::Submit(entry) if self.accepting => self.scheduler.add(*entry),
            Command::Submit(entry) => {
                let _ = entry.events.send(Event::Failed(SubmitError::ShuttingDown.to_string()));
            }
            Command::Shutdown => self.accepting = false,
        }
    }

    fn publish(&mut self) {
        let mut shared = self.shared.lock().expect("metrics lock");
        shared.in_transit -= std::mem::take(&mut self.taken);
        self.scheduler.fill_metrics(&self.runner, &mut shared.metrics);
        shared.metrics.waiting += shared.in_transit;
    }
}

//! The engine on a thread of its own, for the server: requests arrive over a channel and each
//! gets its own channel of events. Dropping a request's event receiver cancels it and frees
//! its KV blocks.
//!
//! A panic on the engine thread (a bug) ends it: its requests' event channels close, later
//! submissions are refused with the panic's message, and `failed` completes, so a server can
//! report itself unhealthy and stop rather than serve errors forever.

use crate::engine::Engine;
use crate::engine_metrics::EngineMetrics;
use crate::error::SubmitError;
use crate::request::{Event, Request};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;

enum Command {
    Submit(Box<(Request, UnboundedSender<Event>)>),
    ResetPrefixCache,
    Shutdown,
    #[cfg(test)]
    Panic,
}

/// What the engine thread publishes and the handles read, under one lock.
struct Shared {
    metrics: EngineMetrics,
    /// Requests submitted that the engine has not published as taken from its inbox. They
    /// count in `metrics.waiting`: the engine's own count would leave them out until then,
    /// and let a full queue take more.
    in_transit: usize,
    /// Set by `shutdown`: later submissions are refused here, so none reaches an engine that
    /// no longer takes them.
    shutting_down: bool,
}

/// The way in: cheap to clone, usable from any thread or task.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    shared: Arc<Mutex<Shared>>,
    /// Why the engine thread died, once it has.
    failure: watch::Receiver<Option<String>>,
    max_model_len: usize,
    vocab_size: usize,
    max_waiting: usize,
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn start(engine: Engine) -> Self {
        let (commands, inbox) = mpsc::channel();
        let shared = Arc::new(Mutex::new(Shared {
            metrics: EngineMetrics {
                kv_blocks_total: engine.num_blocks(),
                ..Default::default()
            },
            in_transit: 0,
            shutting_down: false,
        }));
        let (failed, failure) = watch::channel(None);
        let handle = Self {
            commands,
            shared: shared.clone(),
            failure,
            max_model_len: engine.max_model_len(),
            vocab_size: engine.target().dims().vocab_size,
            max_waiting: engine.max_waiting(),
        };
        std::thread::Builder::new()
            .name("peagle-engine".into())
            .spawn(move || {
                let engine = EngineLoop {
                    engine,
                    inbox,
                    shared,
                    taken: 0,
                    accepting: true,
                };
                // Unwinding drops the engine, and with it every request's event sender.
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| engine.run())) {
                    let why = panic_message(panic.as_ref());
                    tracing::error!(why, "the engine thread panicked; no request can run from now on");
                    let _ = failed.send(Some(why));
                }
            })
            .expect("spawning the engine thread");
        handle
    }

    /// Why the engine thread died, if it has.
    pub fn failure(&self) -> Option<String> {
        self.failure.borrow().clone()
    }

    /// Completes with the reason when the engine thread dies; never while it runs, nor once
    /// it has stopped after a shutdown.
    pub async fn failed(&self) -> String {
        let mut failure = self.failure.clone();
        let why = failure.wait_for(Option::is_some).await.map(|why| why.clone());
        match why {
            Ok(why) => why.unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Queues a request; its events arrive on the returned receiver.
    pub fn submit(&self, request: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        Ok(self.submit_all(vec![request])?.remove(0))
    }

    /// Queues requests that belong together (the choices of one response), all or none. Each
    /// counts against the queue limit: they must all fit in the room left, unless the queue is
    /// empty, so that a response with more choices than the limit is not refused forever (the
    /// server caps choices per response).
    pub fn submit_all(&self, requests: Vec<Request>) -> Result<Vec<UnboundedReceiver<Event>>, SubmitError> {
        for r in &requests {
            r.validate(self.max_model_len, self.vocab_size)
                .map_err(SubmitError::Invalid)?;
        }
        let count = requests.len();
        // Held while sending, so a shutdown comes wholly before or after these submissions.
        let mut shared = self.shared();
        if let Some(why) = self.failure() {
            return Err(SubmitError::EngineDead(why));
        }
        if shared.shutting_down {
            return Err(SubmitError::ShuttingDown);
        }
        let waiting = shared.metrics.waiting;
        if waiting > 0 && waiting + count > self.max_waiting {
            return Err(SubmitError::QueueFull {
                waiting,
                limit: self.max_waiting,
            });
        }
        shared.metrics.waiting += count;
        shared.in_transit += count;
        let mut receivers = Vec::with_capacity(count);
        for (sent, request) in requests.into_iter().enumerate() {
            let (tx, rx) = unbounded_channel();
            if self.commands.send(Command::Submit(Box::new((request, tx)))).is_err() {
                shared.metrics.waiting -= count - sent;
                shared.in_transit -= count - sent;
                return Err(self
                    .failure()
                    .map_or(SubmitError::ShuttingDown, SubmitError::EngineDead));
            }
            receivers.push(rx);
        }
        Ok(receivers)
    }

    pub fn metrics(&self) -> EngineMetrics {
        self.shared().metrics.clone()
    }

    /// Forgets every cached prefix before the engine takes any later submission.
    pub fn reset_prefix_cache(&self) {
        let _ = self.commands.send(Command::ResetPrefixCache);
    }

    /// Refuses new requests from now on; those already queued or running still finish.
    pub fn shutdown(&self) {
        let mut shared = self.shared();
        shared.shutting_down = true;
        let _ = self.commands.send(Command::Shutdown);
    }
}

struct EngineLoop {
    engine: Engine,
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
            if self.engine.is_idle() {
                match self.inbox.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => return,
                }
            }
            while let Ok(cmd) = self.inbox.try_recv() {
                self.handle(cmd);
            }
            self.engine.step();
            self.publish();
            if !self.accepting && self.engine.is_idle() {
                return;
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        if let Command::Submit(_) = cmd {
            self.taken += 1;
        }
        match cmd {
            Command::Submit(submission) if self.accepting => {
                let (request, events) = *submission;
                self.engine.add(request, events);
            }
            Command::Submit(submission) => {
                let _ = submission.1.send(Event::Failed(SubmitError::ShuttingDown.to_string()));
            }
            Command::ResetPrefixCache => self.engine.reset_prefix_cache(),
            Command::Shutdown => self.accepting = false,
            #[cfg(test)]
            Command::Panic => panic!("asked to"),
        }
    }

    fn publish(&mut self) {
        let mut shared = lock(&self.shared);
        shared.in_transit -= std::mem::take(&mut self.taken);
        self.engine.fill_metrics(&mut shared.metrics);
        shared.metrics.waiting += shared.in_transit;
    }
}

/// The state the engine thread publishes. A panic while it held the lock left nothing
/// half-written that matters here: counts, read for metrics and the queue limit.
fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A panic's payload as text: what `panic!` and `expect` give, a `String` or a `&str`.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<String>(), payload.downcast_ref::<&str>()) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) => s.to_string(),
        (None, None) => "a panic with no message".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::EngineBuilder;
    use crate::request::GenerateParams;
    use std::path::PathBuf;

    fn request(max_tokens: usize) -> Request {
        let params = GenerateParams {
            max_tokens,
            ignore_eos: true,
            ..GenerateParams::default()
        };
        Request::new(vec![5, 6, 7], params)
    }

    #[tokio::test]
    async fn a_panic_on_the_engine_thread_fails_its_requests_and_refuses_the_next() {
        let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-llama");
        let handle = EngineHandle::start(EngineBuilder::new(model).build().unwrap().engine);
        let finished = |mut events: UnboundedReceiver<Event>| async move {
            while let Some(event) = events.recv().await {
                if let Event::Finished { .. } = event {
                    return true;
                }
            }
            false
        };
        assert!(finished(handle.submit(request(4)).unwrap()).await);
        assert_eq!(handle.failure(), None);
        // Commands are taken before every step: the panic comes long before 100 tokens.
        let running = handle.submit(request(100)).unwrap();
        handle.commands.send(Command::Panic).unwrap();
        assert_eq!(handle.failed().await, "asked to");
        assert!(!finished(running).await, "the running request's events end unfinished");
        assert_eq!(handle.failure().as_deref(), Some("asked to"));
        assert_eq!(
            handle.submit(request(4)).unwrap_err(),
            SubmitError::EngineDead("asked to".into())
        );
        assert_eq!(handle.metrics().running, 0);
    }
}

//! Background responses while they run (`background: true`): each run's response as it
//! stands and the stream events written so far, for `GET /v1/responses/{id}` (polling, or
//! following its events from a sequence number) and `POST /v1/responses/{id}/cancel`. A run
//! leaves here once its finished response is in the store (`responses_store`), which then
//! answers for it, so that a response is always found in one or the other. A graceful stop
//! waits for the runs to end (`Runs::all_done`), as it does for requests on a connection.

use futures_util::Stream;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

/// One event of a Responses stream as written: its type and its JSON, sequence number
/// included.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedEvent {
    pub kind: String,
    pub data: String,
}

/// The runs by response id, behind a watch channel so that a graceful stop can wait for the
/// map to empty.
#[derive(Default)]
pub struct Runs {
    runs: watch::Sender<HashMap<String, Arc<Run>>>,
}

impl Runs {
    pub fn insert(&self, id: String, run: Arc<Run>) {
        self.runs.send_modify(|runs| {
            runs.insert(id, run);
        });
    }

    pub fn get(&self, id: &str) -> Option<Arc<Run>> {
        self.runs.borrow().get(id).cloned()
    }

    pub fn remove(&self, id: &str) {
        self.runs.send_modify(|runs| {
            runs.remove(id);
        });
    }

    /// Resolves once there are no runs (at once if there are none now).
    pub fn all_done(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut runs = self.runs.subscribe();
        async move {
            // Err only where the runs are gone, and with them any run to wait for.
            let _ = runs.wait_for(HashMap::is_empty).await;
        }
    }
}

/// A running response: what its task has written, seen by any number of readers.
pub struct Run {
    state: watch::Sender<RunState>,
    cancel: watch::Sender<bool>,
}

struct RunState {
    /// The response object's JSON as it stands: queued or in progress, then as it ended.
    response: String,
    events: Vec<SavedEvent>,
    /// Whether the task has written all it will.
    done: bool,
}

impl Run {
    /// A run whose response is `response` (JSON) until its task writes another.
    pub fn new(response: String) -> Arc<Self> {
        let state = RunState {
            response,
            events: Vec::new(),
            done: false,
        };
        Arc::new(Self {
            state: watch::Sender::new(state),
            cancel: watch::Sender::new(false),
        })
    }

    pub fn response(&self) -> String {
        self.state.borrow().response.clone()
    }

    pub fn set_response(&self, response: String) {
        self.state.send_modify(|state| state.response = response);
    }

    /// Adds the stream's next event; its readers wake to it.
    pub fn push(&self, event: SavedEvent) {
        self.state.send_modify(|state| state.events.push(event));
    }

    /// The events written, for the store to keep once the run is over.
    pub fn events(&self) -> Vec<SavedEvent> {
        self.state.borrow().events.clone()
    }

    /// Marks the run over: its readers have all its events.
    pub fn finish(&self) {
        self.state.send_modify(|state| state.done = true);
    }

    /// Asks the task to stop; the run is over once `wait_done` returns.
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }

    /// Resolves once `cancel` was called (at once if it already was).
    pub fn cancelled(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut asked = self.cancel.subscribe();
        async move {
            // Err only where the run is gone, and with it anyone to ask.
            let _ = asked.wait_for(|asked| *asked).await;
        }
    }

    /// Resolves once the task has written all it will.
    pub async fn wait_done(&self) {
        let mut state = self.state.subscribe();
        let _ = state.wait_for(|state| state.done).await;
    }

    /// The events from index `from` on, those written and those to come, until the run is
    /// over.
    pub fn follow(&self, from: usize) -> impl Stream<Item = SavedEvent> + Send + 'static {
        let mut state = self.state.subscribe();
        async_stream::stream! {
            let mut next = from;
            loop {
                let (new, done) = {
                    let state = state.borrow_and_update();
                    (state.events.get(next..).unwrap_or_default().to_vec(), state.done)
                };
                next += new.len();
                for event in new {
                    yield event;
                }
                // The sender lives as long as the run, and a run that is gone is over.
                if done || state.changed().await.is_err() {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use std::future::Future;
    use std::time::Duration;

    /// `future`'s output, or a failure where it would hang.
    async fn soon<T>(future: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), future)
            .await
            .expect("hung")
    }

    fn event(n: usize) -> SavedEvent {
        SavedEvent {
            kind: "response.output_text.delta".into(),
            data: format!("{{\"sequence_number\":{n}}}"),
        }
    }

    /// A reader that joins late gets the events from where it asked, then those written
    /// after, and ends with the run.
    #[tokio::test]
    async fn readers_get_every_event_from_where_they_join_to_the_end() {
        let run = Run::new("{}".into());
        run.push(event(0));
        run.push(event(1));
        let late = run.follow(1);
        let all = run.follow(0);
        let writer = {
            let run = run.clone();
            tokio::spawn(async move {
                run.push(event(2));
                run.set_response("{\"status\":\"completed\"}".into());
                run.finish();
            })
        };
        let late: Vec<SavedEvent> = soon(late.collect()).await;
        let all: Vec<SavedEvent> = soon(all.collect()).await;
        soon(writer).await.unwrap();
        assert_eq!(late, [event(1), event(2)]);
        assert_eq!(all, [event(0), event(1), event(2)]);
        assert_eq!(run.response(), "{\"status\":\"completed\"}");
        assert!(soon(run.follow(5).collect::<Vec<_>>()).await.is_empty());
        soon(run.wait_done()).await;
    }

    #[tokio::test]
    async fn all_done_resolves_once_the_last_run_is_removed() {
        let runs = Runs::default();
        soon(runs.all_done()).await;
        runs.insert("a".into(), Run::new("{}".into()));
        runs.insert("b".into(), Run::new("{}".into()));
        let waiting = runs.all_done();
        runs.remove("a");
        let still_one = tokio::time::timeout(Duration::from_millis(50), runs.all_done()).await;
        assert!(still_one.is_err(), "resolved with a run left");
        runs.remove("b");
        soon(waiting).await;
    }

    #[tokio::test]
    async fn a_cancel_reaches_the_task_whenever_it_listens() {
        let run = Run::new("{}".into());
        let before = run.cancelled();
        run.cancel();
        soon(before).await;
        soon(run.cancelled()).await;
    }
}

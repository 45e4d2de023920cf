//! A response's answer as the Responses stream's events: `response.created` and
//! `.in_progress`, the output items' events as the answer's parser splits it, and its end
//! (`Step::End`), which the caller stores and closes with `response.completed` (or
//! `.incomplete`, `.failed`). A client's stream numbers and sends them as they come
//! (`sse_of`); a background response's task writes them to its run (`responses_background`).

use super::chat_start::StartedChat;
use super::responses::{only_choice, Head};
use super::responses_logprobs::TextEntries;
use super::responses_output::OutputItems;
use crate::error::ApiError;
use crate::protocol::chat::ChatMessage;
use crate::protocol::responses::ResponseObject;
use crate::responses_runs::SavedEvent;
use crate::state::AppState;
use axum::response::sse::{Event, Sse};
use futures_util::{Stream, StreamExt};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

/// What the answer's stream gives.
pub enum Step {
    /// An event, without its sequence number.
    Event(Value),
    /// The response as it ended and its answer, the conversation's next message; `closing`
    /// where the stream ends with the response's own event (`response.completed`, ...), not
    /// after an `error` event or a cancel.
    End {
        response: Box<ResponseObject>,
        answer: ChatMessage,
        closing: bool,
    },
}

/// The steps of `started`'s answer, ending in one `Step::End`: as the engine ended it, as an
/// error ended it (failed), or as `cancelled` resolving first ended it (cancelled, its last
/// item incomplete).
pub fn answer_steps(
    state: Arc<AppState>,
    head: Head,
    started: StartedChat,
    cancelled: impl Future<Output = ()> + Send + 'static,
) -> impl Stream<Item = Step> + Send + 'static {
    let mut parser = started.parser(&state.model);
    let prompt_tokens = started.prompt_tokens;
    let logprobs = started.logprobs.is_some();
    let choice = only_choice(started.choices);
    async_stream::stream! {
        let mut output = OutputItems::new(logprobs);
        let mut entries = TextEntries::default();
        let opening = head.opening();
        yield Step::Event(json!({"type": "response.created", "response": opening}));
        let running = head.object("in_progress", &output, None);
        yield Step::Event(json!({"type": "response.in_progress", "response": running}));
        let mut choice = match choice {
            Ok(choice) => choice,
            Err(e) => {
                yield Step::Event(error_event(&e));
                yield failed(&head, &mut output);
                return;
            }
        };
        let mut cancelled = std::pin::pin!(cancelled);
        loop {
            let next = tokio::select! {
                biased;
                () = &mut cancelled => None,
                update = choice.next() => Some(update),
            };
            let Some(update) = next else {
                output.finish("incomplete");
                for event in output.take_events() {
                    yield Step::Event(event);
                }
                let response = head.object("cancelled", &output, None);
                yield Step::End { response: Box::new(response), answer: output.answer(), closing: false };
                return;
            };
            let ended = || Err(ApiError::internal("the answer ended without its finish"));
            let update = match update.unwrap_or_else(ended) {
                Ok(update) => update,
                Err(e) => {
                    yield Step::Event(error_event(&e));
                    yield failed(&head, &mut output);
                    return;
                }
            };
            let last = update.finish.is_some();
            entries.add(&mut parser, &mut output, &update.text, update.logprobs, &update.released, last);
            for event in output.take_events() {
                yield Step::Event(event);
            }
            let Some(finish) = update.finish else {
                continue;
            };
            let response = head.finished(&state, &mut output, &finish, prompt_tokens).await;
            for event in output.take_events() {
                yield Step::Event(event);
            }
            yield Step::End { response: Box::new(response), answer: output.answer(), closing: true };
            return;
        }
    }
}

/// The end of an answer an error cut short: failed, its last item incomplete. The item's
/// closing events are left out, as the stream's `error` event ends it.
fn failed(head: &Head, output: &mut OutputItems) -> Step {
    output.finish("incomplete");
    output.take_events();
    Step::End {
        response: Box::new(head.object("failed", output, None)),
        answer: output.answer(),
        closing: false,
    }
}

/// The event that closes a stream whose response ended as `response`.
pub fn closing_event(response: &ResponseObject) -> Value {
    json!({"type": format!("response.{}", response.status), "response": response})
}

/// Numbers a stream's events in order, from 0.
#[derive(Default)]
pub struct Sequence(u64);

impl Sequence {
    pub fn number(&mut self, mut fields: Value) -> SavedEvent {
        fields["sequence_number"] = json!(self.0);
        self.0 += 1;
        SavedEvent {
            kind: fields["type"].as_str().unwrap_or_default().to_string(),
            data: fields.to_string(),
        }
    }
}

/// A client's stream of its response's answer: the steps' events numbered, the response
/// stored (`keep`) as it ends, then its closing event. The answer goes as long as the client
/// reads: a client gone drops the stream, and with it the answer's sequence.
pub fn sse_of(
    state: Arc<AppState>,
    head: Head,
    started: StartedChat,
    kept: Option<super::responses::Kept>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let steps = answer_steps(state.clone(), head, started, std::future::pending());
    let events = async_stream::stream! {
        let mut sequence = Sequence::default();
        let mut kept = kept;
        for await step in steps {
            match step {
                Step::Event(event) => yield sequence.number(event),
                Step::End { response, answer, closing } => {
                    super::responses::keep(&state, &response, kept.take(), answer, Vec::new());
                    if closing {
                        yield sequence.number(closing_event(&response));
                    }
                }
            }
        }
    };
    sse_of_saved(events)
}

/// Written events as a server-sent stream: `event: TYPE` and `data: JSON` each.
pub fn sse_of_saved(
    events: impl Stream<Item = SavedEvent> + Send + 'static,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    Sse::new(events.map(|saved| Ok(Event::default().event(saved.kind).data(saved.data))))
}

/// A stream's `error` event, as the Responses API has it: the error's code, message and
/// field, without the `error` object around them.
fn error_event(e: &ApiError) -> Value {
    let error = &e.body()["error"];
    json!({"type": "error", "code": error["code"], "message": error["message"], "param": error["param"]})
}

//! Server-sent events for streamed responses: `data: {json}` chunks, `data: [DONE]` last.
//! The stream owns the choices, so a client that goes away drops them and so cancels their
//! engine requests.

use crate::choice::{Choice, Update};
use crate::error::ApiError;
use axum::response::sse::Event;
use futures_util::stream::{self, select_all, Stream, StreamExt};
use serde::Serialize;

/// Updates of all choices as they come, tagged with the choice's index.
pub fn merged(choices: Vec<Choice>) -> impl Stream<Item = (usize, Result<Update, ApiError>)> + Send {
    select_all(choices.into_iter().enumerate().map(|(index, choice)| {
        stream::unfold(choice, |mut c| async move { c.next().await.map(|u| (u, c)) })
            .map(move |u| (index, u))
            .boxed()
    }))
}

pub fn json_event(chunk: &impl Serialize) -> Event {
    // Our response types always serialize.
    Event::default().data(serde_json::to_string(chunk).unwrap_or_default())
}

pub fn error_event(e: &ApiError) -> Event {
    Event::default().data(e.body().to_string())
}

pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}

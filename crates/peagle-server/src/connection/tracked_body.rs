//! A response body that keeps its request counted as in flight on its connection until the
//! body is written or dropped: a streamed completion runs long after its handler returned,
//! and its connection is busy all that time (never idle-closed, never shed).

use super::registry::InFlight;
use axum::body::{Body, Bytes};
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

pub struct TrackedBody {
    inner: Body,
    _in_flight: InFlight,
}

impl TrackedBody {
    pub fn new(inner: Body, in_flight: InFlight) -> Self {
        Self {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

//! The JSON body extractor. axum's own `Json` answers in plain text (and 422 for wrong field
//! types); OpenAI clients expect 400 with an error object naming the field, so every failure
//! (content type, size, time, syntax, types) is an `ApiError` here.
//!
//! The body is read under two bounds: `max_body_bytes` (413) and `body_timeout` (408, so a
//! body shorter than its declared length does not hold the connection forever). A body
//! declared too large is refused before reading it; one sent anyway is read and thrown away
//! before the 413 goes out, because closing a socket with unread data resets the connection,
//! and a client still sending would never see the answer.

use crate::error::ApiError;
use crate::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, EXPECT};
use axum::http::{HeaderMap, StatusCode};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// Most bytes of an oversized body read and dropped so that its sender gets the 413.
const DRAIN_LIMIT: usize = 64 << 20;

pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<AppState>> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        typed(body(req, state).await?).map(ApiJson)
    }
}

/// One body read as two types, each from the whole object: fields shared by several routes
/// live in their own type, and a wrongly typed one is still reported by its path (serde's
/// `flatten` would lose it).
pub struct ApiJsonViews<A, B>(pub A, pub B);

impl<A: DeserializeOwned, B: DeserializeOwned> FromRequest<Arc<AppState>> for ApiJsonViews<A, B> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let value = body(req, state).await?;
        Ok(ApiJsonViews(typed(value.clone())?, typed(value)?))
    }
}

/// A body without a content type is read as JSON, as FastAPI (and so vLLM) reads it; another
/// content type is 415.
async fn body(req: Request, state: &AppState) -> Result<serde_json::Value, ApiError> {
    let json = req
        .headers()
        .get(CONTENT_TYPE)
        .is_none_or(|v| v.to_str().is_ok_and(is_json));
    if !json {
        return Err(ApiError::client(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Expected request with `Content-Type: application/json`",
        ));
    }
    let config = &state.config;
    let (parts, body) = req.into_parts();
    let read = read_bounded(&parts.headers, body, config.max_body_bytes);
    let bytes = tokio::time::timeout(config.body_timeout, read).await.map_err(|_| {
        ApiError::client(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the request body did not arrive within {} s",
                config.body_timeout.as_secs_f64()
            ),
        )
    })??;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid(None, format!("invalid JSON body: {e}")))
}

/// `application/json`, or a JSON-based type such as `application/merge-patch+json`, as axum's
/// `Json` takes them.
fn is_json(content_type: &str) -> bool {
    let media = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    media == "application/json" || media.starts_with("application/") && media.ends_with("+json")
}

async fn read_bounded(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::client(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("the request body is larger than the server's limit of {limit} bytes"),
        )
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut chunks = body.into_data_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        // A client that asked to be told first (`Expect: 100-continue`) has sent nothing.
        if !headers.contains_key(EXPECT) {
            drain(&mut chunks).await;
        }
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0) as usize);
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| ApiError::invalid(None, format!("reading the request body: {e}")))?;
        if bytes.len() + chunk.len() > limit {
            drain(&mut chunks).await;
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes.into())
}

async fn drain(chunks: &mut axum::body::BodyDataStream) {
    let mut drained = 0;
    while let Some(Ok(chunk)) = chunks.next().await {
        drained += chunk.len();
        if drained > DRAIN_LIMIT {
            return;
        }
    }
}

/// The typed pass, which reports the path of a wrongly typed field.
fn typed<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        match path.as_str() {
            "." => ApiError::invalid(None, e.inner().to_string()),
            _ => ApiError::invalid(Some(&path), format!("{path}: {}", e.inner())),
        }
    })
}

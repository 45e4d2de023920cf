//! The JSON body extractor. axum's own `Json` answers in plain text (and 422 for wrong field
//! types); OpenAI clients expect 400 with an error object naming the field, so every failure
//! (content type, size limit, syntax, types) is turned into an `ApiError` here.

use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::Json;
use serde::de::DeserializeOwned;

pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        typed(body(req, state).await?).map(ApiJson)
    }
}

/// One body read as two types, each from the whole object: fields shared by several routes
/// live in their own type, and a wrongly typed one is still reported by its path (serde's
/// `flatten` would lose it).
pub struct ApiJsonViews<A, B>(pub A, pub B);

impl<A: DeserializeOwned, B: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJsonViews<A, B> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let value = body(req, state).await?;
        Ok(ApiJsonViews(typed(value.clone())?, typed(value)?))
    }
}

/// Syntax errors and body limits come from axum's parse to a Value. A body without a content
/// type is read as JSON, as FastAPI (and so vLLM) reads it; another content type is 415.
async fn body<S: Send + Sync>(req: Request, state: &S) -> Result<serde_json::Value, ApiError> {
    let Json(value) = match req.headers().contains_key(CONTENT_TYPE) {
        true => Json::<serde_json::Value>::from_request(req, state).await,
        false => {
            let bytes = Bytes::from_request(req, state).await.map_err(|r| rejection(r.into()))?;
            Json::from_bytes(&bytes)
        }
    }
    .map_err(rejection)?;
    Ok(value)
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

fn rejection(r: JsonRejection) -> ApiError {
    match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::client(r.status(), "request_too_large", r.body_text()),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::client(r.status(), "unsupported_media_type", r.body_text()),
        _ => ApiError::invalid(None, r.body_text()),
    }
}

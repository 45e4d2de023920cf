//! The JSON body extractor. axum's own `Json` answers in plain text (and 422 for wrong field
//! types); OpenAI clients expect 400 with an error object naming the field, so every failure
//! (content type, size limit, syntax, types) is turned into an `ApiError` here.

use crate::error::ApiError;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::Json;
use serde::de::DeserializeOwned;

pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        // Parse to a Value first: syntax errors and body limits come from axum, then the
        // typed pass reports the path of a wrongly typed field.
        let Json(value) = Json::<serde_json::Value>::from_request(req, state)
            .await
            .map_err(rejection)?;
        serde_path_to_error::deserialize(value).map(ApiJson).map_err(|e| {
            let path = e.path().to_string();
            match path.as_str() {
                "." => ApiError::invalid(None, e.inner().to_string()),
                _ => ApiError::invalid(Some(&path), format!("{path}: {}", e.inner())),
            }
        })
    }
}

fn rejection(r: JsonRejection) -> ApiError {
    match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::client(r.status(), "request_too_large", r.body_text()),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::client(r.status(), "unsupported_media_type", r.body_text()),
        _ => ApiError::invalid(None, r.body_text()),
    }
}

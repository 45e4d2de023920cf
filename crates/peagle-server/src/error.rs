//! Errors as OpenAI clients expect them: an HTTP status and
//! `{"error": {"message", "type", "param", "code"}}`, so SDKs raise the right exception.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use peagle_engine::SubmitError;
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's error `type`: invalid_request_error, authentication_error, server_error ...
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400: the request is wrong; `param` names the field.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> Self {
        Self {
            param: param.map(str::to_owned),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// Any other client-side status (404 route, 405, 413, 415) in the same shape.
    pub fn client(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code: Some(code),
            ..Self::new(status, "invalid_request_error", message)
        }
    }

    pub fn model_not_found(model: &str) -> Self {
        Self {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model `{model}` does not exist."),
            )
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "Missing or incorrect API key: send `Authorization: Bearer <key>`.",
            )
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            code: Some("internal_error"),
            ..Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
        }
    }

    /// 503: the server cannot serve now; `code` says why.
    pub fn unavailable(code: &'static str, message: String) -> Self {
        Self {
            code: Some(code),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    /// The JSON object, also sent as an SSE event when a stream fails after its headers.
    pub fn body(&self) -> serde_json::Value {
        json!(ErrorResponse {
            error: ErrorObject {
                message: self.message.clone(),
                kind: self.kind,
                param: self.param.clone(),
                code: self.code,
            }
        })
    }
}

/// Every error response's body.
#[derive(Serialize, ToSchema)]
pub struct ErrorResponse {
    error: ErrorObject,
}

#[derive(Serialize, ToSchema)]
struct ErrorObject {
    message: String,
    /// invalid_request_error, authentication_error or server_error.
    #[serde(rename = "type")]
    kind: &'static str,
    /// The request field at fault, when there is one.
    param: Option<String>,
    code: Option<&'static str>,
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Invalid(invalid) => Self::invalid(Some(invalid.param()), invalid.to_string()),
            SubmitError::QueueFull { .. } => Self::unavailable("server_busy", e.to_string()),
            SubmitError::ShuttingDown => Self::unavailable("shutting_down", e.to_string()),
            SubmitError::EngineDead(_) => Self {
                code: Some("engine_dead"),
                ..Self::internal(e.to_string())
            },
        }
    }
}

impl IntoResponse for ApiError {
    /// The JSON error, with the headers HTTP asks for: a 503 says when to retry, a 401 which
    /// scheme authenticates.
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        let headers = response.headers_mut();
        match self.status {
            StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            StatusCode::UNAUTHORIZED => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_carry_the_headers_http_asks_for() {
        let busy = ApiError::from(SubmitError::ShuttingDown).into_response();
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(busy.headers()[header::RETRY_AFTER], "1");
        let denied = ApiError::unauthorized().into_response();
        assert_eq!(denied.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let invalid = ApiError::invalid(None, "no").into_response();
        assert!(invalid.headers().get(header::RETRY_AFTER).is_none());
    }
}

//! The router: OpenAI routes and vLLM's /tokenize and /detokenize behind the API key (as is
//! every unknown path), open /health and /metrics, and OpenAI-style errors for everything axum
//! would otherwise answer in plain text (unknown routes, wrong methods) or not at all (a
//! panicking handler). CORS comes first, so browsers' preflight requests need no key, as in
//! vLLM.

use crate::auth::require_api_key;
use crate::error::ApiError;
use crate::openapi::openapi_json;
use crate::request_id::request_id_header;
use crate::routes::{
    chat, completions, info, prefix_cache, responses, responses_background, responses_items, tokenize,
};
use crate::state::{AppState, ServerConfig};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{middleware, Router};
use std::any::Any;
use std::sync::Arc;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer};

pub fn routes(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/responses", post(responses::responses))
        .route(
            "/v1/responses/{id}",
            get(responses::get_response).delete(responses::delete_response),
        )
        .route("/v1/responses/{id}/input_items", get(responses_items::list_input_items))
        .route("/v1/responses/{id}/cancel", post(responses_background::cancel_response))
        .route("/v1/models", get(info::models))
        // A catch-all: served names such as openai/gpt-oss-20b hold slashes.
        .route("/v1/models/{*id}", get(info::model))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/reset_prefix_cache", post(prefix_cache::reset_prefix_cache))
        .route("/health", get(info::health))
        .route("/version", get(info::version))
        .route("/metrics", get(info::metrics))
        .route("/openapi.json", get(openapi_json))
        .with_state(state)
}

/// Wraps `routes` (ours, plus any an embedder adds) with the error fallbacks and layers.
pub fn app(routes: Router, config: &ServerConfig) -> Result<Router, InvalidOrigin> {
    let mut app = routes
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::map_response(json_errors))
        .layer(middleware::from_fn_with_state(config.api_key.clone(), require_api_key))
        .layer(CatchPanicLayer::custom(panic_response));
    if config.request_id_headers {
        app = app.layer(middleware::from_fn(request_id_header));
    }
    Ok(app.layer(cors_layer(&config.allowed_origins)?))
}

#[derive(Debug, thiserror::Error)]
#[error("allowed origin {0:?} is not a valid header value")]
pub struct InvalidOrigin(String);

impl ServerConfig {
    /// Checks what serving would refuse, so that a binary can refuse it before loading a model.
    pub fn check(&self) -> Result<(), InvalidOrigin> {
        cors_layer(&self.allowed_origins).map(|_| ())
    }
}

/// Any method and header from `origins` (`*`: from anywhere), vLLM's defaults. Methods and
/// headers are echoed rather than answered with `*`, which browsers do not take to cover
/// `Authorization` (as Starlette's middleware behind vLLM does).
fn cors_layer(origins: &[String]) -> Result<CorsLayer, InvalidOrigin> {
    let allowed = match origins.iter().any(|o| o == "*") {
        true => AllowOrigin::any(),
        false => AllowOrigin::list(
            origins
                .iter()
                .map(|o| HeaderValue::from_str(o).map_err(|_| InvalidOrigin(o.clone())))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(CorsLayer::new()
        .allow_origin(allowed)
        .allow_methods(AllowMethods::mirror_request())
        .allow_headers(AllowHeaders::mirror_request()))
}

async fn not_found() -> ApiError {
    ApiError::client(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::client(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

/// Most bytes of a plain-text error kept as the JSON error's message.
const MAX_ERROR_TEXT: usize = 4 << 10;

/// axum's extractors answer their rejections (a path segment that is not UTF-8, say) in plain
/// text; OpenAI clients expect every error as JSON, so such answers are rewritten here.
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let json = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), MAX_ERROR_TEXT)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let message = match text.is_empty() {
        true => status.canonical_reason().unwrap_or("error").to_string(),
        false => text,
    };
    match status.is_server_error() {
        true => ApiError::internal(message),
        false => ApiError::client(status, "invalid_request", message),
    }
    .into_response()
}

/// A panic fails its own request with a 500; the server keeps serving.
fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    tracing::error!(message, "a request handler panicked");
    ApiError::internal(format!("internal error while serving the request: {message}")).into_response()
}

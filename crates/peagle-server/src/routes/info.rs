//! `GET /v1/models` (and `/v1/models/{id}`), `GET /health` and `GET /metrics`.

use super::check_model;
use crate::error::ApiError;
use crate::openapi::ApiErrors;
use crate::protocol::random_id;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::Json;
use peagle_engine::SubmitError;
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Serialize, ToSchema)]
pub struct ModelList {
    /// "list".
    object: &'static str,
    data: Vec<ModelCard>,
}

/// The served model, in OpenAI's model object with vLLM's additions.
#[derive(Serialize, ToSchema)]
pub struct ModelCard {
    id: String,
    /// "model".
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    root: String,
    parent: Option<String>,
    max_model_len: usize,
    /// What OpenAI's legacy model objects carried, and vLLM still sends.
    permission: Vec<ModelPermission>,
}

#[derive(Serialize, ToSchema)]
pub struct ModelPermission {
    id: String,
    object: &'static str,
    created: u64,
    allow_create_engine: bool,
    allow_sampling: bool,
    allow_logprobs: bool,
    allow_search_indices: bool,
    allow_view: bool,
    allow_fine_tuning: bool,
    organization: &'static str,
    group: Option<String>,
    is_blocking: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// "ok".
    status: &'static str,
}

#[utoipa::path(get, path = "/v1/models", tag = "OpenAI", security(("api_key" = [])),
    responses((status = 200, body = ModelList), ApiErrors))]
pub async fn models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![card(&state)],
    })
}

/// `GET /v1/models/{id}`: the served model's card, or 404 for any other name.
#[utoipa::path(get, path = "/v1/models/{id}", tag = "OpenAI", security(("api_key" = [])),
    params(("id" = String, Path, description = "The served model's name")),
    responses((status = 200, body = ModelCard), ApiErrors))]
pub async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<ModelCard>, ApiError> {
    check_model(&state, Some(&id))?;
    Ok(Json(card(&state)))
}

fn card(state: &AppState) -> ModelCard {
    let created = state.model.created;
    ModelCard {
        id: state.model.name.clone(),
        object: "model",
        created,
        owned_by: "peagle",
        root: state.model.name.clone(),
        parent: None,
        max_model_len: state.engine.max_model_len(),
        permission: vec![ModelPermission {
            id: format!("modelperm-{}", random_id()),
            object: "model_permission",
            created,
            allow_create_engine: false,
            allow_sampling: true,
            allow_logprobs: true,
            allow_search_indices: false,
            allow_view: true,
            allow_fine_tuning: false,
            organization: "*",
            group: None,
            is_blocking: false,
        }],
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Version {
    /// peagle's version.
    version: &'static str,
}

/// The server's version, as vLLM's `/version` gives it; no key needed.
#[utoipa::path(get, path = "/version", tag = "Probes", responses((status = 200, body = Version)))]
pub async fn version() -> Json<Version> {
    Json(Version {
        version: env!("CARGO_PKG_VERSION"),
    })
}

/// 200 while the server runs; 503 once it is shutting down or its engine has died, so load
/// balancers stop sending it work (vLLM's). The test scripts wait for the 200.
#[utoipa::path(get, path = "/health", tag = "Probes", responses((status = 200, body = Health), ApiErrors))]
pub async fn health(State(state): State<Arc<AppState>>) -> Result<Json<Health>, ApiError> {
    health_of(state.engine.failure(), *state.stopping.borrow())
}

fn health_of(engine_failure: Option<String>, stopping: bool) -> Result<Json<Health>, ApiError> {
    if let Some(why) = engine_failure {
        return Err(ApiError::unavailable(
            "engine_dead",
            SubmitError::EngineDead(why).to_string(),
        ));
    }
    match stopping {
        true => Err(SubmitError::ShuttingDown.into()),
        false => Ok(Json(Health { status: "ok" })),
    }
}

/// Prometheus text exposition: vLLM's `vllm:` metrics and peagle's own `peagle:` ones.
#[utoipa::path(get, path = "/metrics", tag = "Probes",
    responses((status = 200, body = String, content_type = "text/plain; version=0.0.4")))]
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let text = state.metrics.render(&state.engine.metrics(), &state.model.name);
    ([(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn health_is_503_once_the_server_stops_or_its_engine_dies() {
        assert!(health_of(None, false).is_ok());
        let stopping = health_of(None, true).unwrap_err();
        assert_eq!(
            (stopping.status, stopping.code),
            (StatusCode::SERVICE_UNAVAILABLE, Some("shutting_down"))
        );
        let dead = health_of(Some("index out of bounds".into()), false).unwrap_err();
        assert_eq!(
            (dead.status, dead.code),
            (StatusCode::SERVICE_UNAVAILABLE, Some("engine_dead"))
        );
        assert_eq!(dead.message, "the engine failed: index out of bounds");
    }
}

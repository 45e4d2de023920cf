//! `GET /openapi.json`: the API described from the Rust types that read requests and write
//! responses (utoipa), as vLLM's FastAPI server publishes it. Clients generate SDKs from it,
//! and CI fuzzes the server against it (scripts/fuzz_api.sh).

use crate::error::ErrorResponse;
use crate::json_body::ApiJsonViews;
use crate::routes::{
    chat, completions, info, prefix_cache, responses, responses_background, responses_items, tokenize,
};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::LazyLock;
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, Modify, OpenApi, PartialSchema, ToSchema};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "peagle",
        description = "An OpenAI-compatible LLM server with P-EAGLE speculative decoding: OpenAI's completions, \
                       chat, responses and models routes, and vLLM's tokenize, detokenize, prefix-cache, health, version and metrics routes."
    ),
    paths(
        completions::completions,
        chat::chat_completions,
        responses::responses,
        responses::get_response,
        responses::delete_response,
        responses_items::list_input_items,
        responses_background::cancel_response,
        info::models,
        info::model,
        tokenize::tokenize,
        tokenize::detokenize,
        prefix_cache::reset_prefix_cache,
        info::health,
        info::version,
        info::metrics,
    ),
    components(schemas(ErrorResponse)),
    modifiers(&ApiKey)
)]
struct ApiDoc;

static SPEC: LazyLock<String> = LazyLock::new(|| {
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes")
});

pub async fn openapi_json() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], SPEC.as_str())
}

/// `--api-key`'s scheme: `Authorization: Bearer <key>`.
struct ApiKey;

impl Modify for ApiKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("api_key", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The error statuses a route may answer, each with an OpenAI-style error body.
pub struct ApiErrors;

impl IntoResponses for ApiErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        [
            ("400", "The request is invalid; `param` names the field at fault"),
            ("401", "The API key is missing or wrong"),
            ("404", "No such model or route"),
            ("408", "The request body did not arrive in time"),
            ("413", "The request body is too large"),
            ("415", "The request body is not JSON"),
            ("500", "The server failed while serving the request"),
            (
                "503",
                "The server is busy or shutting down; retry after `Retry-After` seconds",
            ),
        ]
        .into_iter()
        .map(|(status, description)| {
            let body = Content::new(Some(Ref::from_schema_name(ErrorResponse::name())));
            let response = ResponseBuilder::new()
                .description(description)
                .content("application/json", body)
                .build();
            (status.to_string(), response.into())
        })
        .collect()
    }
}

/// One server-sent event of a stream, as OpenAPI before 3.2 describes a `text/event-stream`
/// schema: event by event. Its `data` is a chunk as JSON, and `[DONE]` last.
pub struct StreamEvent;

impl PartialSchema for StreamEvent {
    fn schema() -> RefOr<Schema> {
        let data = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("A chunk, in the response's JSON shape; `[DONE]` ends the stream"));
        ObjectBuilder::new().property("data", data).required("data").into()
    }
}

impl ToSchema for StreamEvent {}

/// A body read as two views holds the fields of both.
impl<A: ToSchema, B: ToSchema> PartialSchema for ApiJsonViews<A, B> {
    fn schema() -> RefOr<Schema> {
        AllOfBuilder::new()
            .item(Ref::from_schema_name(A::name()))
            .item(Ref::from_schema_name(B::name()))
            .into()
    }
}

impl<A: ToSchema, B: ToSchema> ToSchema for ApiJsonViews<A, B> {
    fn name() -> Cow<'static, str> {
        Cow::Owned(format!("{}Body", A::name()))
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((A::name().into_owned(), A::schema()));
        A::schemas(schemas);
        schemas.push((B::name().into_owned(), B::schema()));
        B::schemas(schemas);
    }
}

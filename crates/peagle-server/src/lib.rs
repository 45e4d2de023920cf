//! peagle's OpenAI-compatible HTTP API (axum): `/v1/completions`, `/v1/chat/completions`,
//! `/v1/models`, `/health` and Prometheus `/metrics`, streamed over SSE or not, on top of the
//! engine thread of peagle-engine (docs/ARCHITECTURE.md).

pub mod answer;
mod app;
mod auth;
pub mod chat_template;
pub mod choice;
mod choice_text;
mod connection;
mod constraints;
pub mod error;
pub mod fd_limit;
pub mod forced_calls;
pub mod harmony;
pub mod hermes;
mod histogram;
mod json_body;
pub mod llama3_json;
pub mod loader;
pub mod metrics;
mod openapi;
mod params;
pub mod protocol;
mod python_json;
mod request_id;
mod responses_runs;
mod responses_store;
mod routes;
pub mod served_model;
mod server;
mod sse;
pub mod state;
mod stop;
mod text_workers;
pub mod thinking;

pub use error::ApiError;
pub use loader::{start_engine, StartError};
/// What `start_engine` builds from.
pub use peagle_engine::{DraftModel, EngineBuilder, GenerationDefaults};
pub use served_model::{Parsers, ServedModel, ToolCallParser};
pub use server::Server;
pub use state::ServerConfig;
pub use thinking::ReasoningParser;

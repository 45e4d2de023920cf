//! What every handler shares: the engine, the model's tokenizer side, metrics and settings.

use crate::metrics::ServerMetrics;
use crate::responses_runs::Runs;
use crate::responses_store::ResponseStore;
use crate::served_model::ServedModel;
use crate::text_workers::TextWorkers;
use peagle_engine::EngineHandle;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Clients must send `Authorization: Bearer <key>` on /v1 routes when set.
    pub api_key: Option<String>,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// After SIGINT/SIGTERM, in-flight requests get this long to finish before they are ended.
    pub shutdown_timeout: Duration,
    /// Origins browsers may call the API from (CORS); `*` is any, as vLLM's default.
    pub allowed_origins: Vec<String>,
    /// Every response carries an `X-Request-Id` header (vLLM's `--enable-request-id-headers`).
    pub request_id_headers: bool,
    /// A request's headers must arrive whole within this (nginx's `client_header_timeout`).
    pub header_timeout: Duration,
    /// A request's body must arrive whole within this, or the request gets 408.
    pub body_timeout: Duration,
    /// A connection with no request in flight that sends nothing for this long is closed
    /// (uvicorn's `timeout_keep_alive`, vLLM's 5 s).
    pub keep_alive_timeout: Duration,
    /// Most sequences (prompts × n) one request may ask for; more is 400.
    pub max_sequences_per_request: usize,
    /// Bytes of responses kept for `previous_response_id` and `/v1/responses/{id}`; 0 keeps
    /// none (`responses_store`).
    pub responses_store_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_body_bytes: 4 << 20,
            shutdown_timeout: Duration::from_secs(30),
            allowed_origins: vec!["*".into()],
            request_id_headers: false,
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            keep_alive_timeout: Duration::from_secs(5),
            max_sequences_per_request: 256,
            responses_store_bytes: 64 << 20,
        }
    }
}

pub struct AppState {
    pub engine: EngineHandle,
    pub text_workers: TextWorkers,
    pub model: ServedModel,
    pub metrics: ServerMetrics,
    pub config: ServerConfig,
    pub responses: ResponseStore,
    /// Background responses while they run; the store has them once they end.
    pub runs: Runs,
    /// Turns true when the server starts shutting down.
    pub stopping: watch::Receiver<bool>,
    /// Turns true when the shutdown grace period is over: requests still running end now.
    pub abort: watch::Receiver<bool>,
}

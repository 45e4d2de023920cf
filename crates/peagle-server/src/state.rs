//! What every handler shares: the engine, the model's tokenizer side, metrics and settings.

use crate::metrics::ServerMetrics;
use crate::served_model::ServedModel;
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
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            max_body_bytes: 4 << 20,
            shutdown_timeout: Duration::from_secs(30),
            allowed_origins: vec!["*".into()],
            request_id_headers: false,
        }
    }
}

pub struct AppState {
    pub engine: EngineHandle,
    pub model: ServedModel,
    pub metrics: ServerMetrics,
    pub config: ServerConfig,
    /// Turns true when the shutdown grace period is over: requests still running end now.
    pub abort: watch::Receiver<bool>,
}

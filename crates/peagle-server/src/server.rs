//! Serving and graceful shutdown. On the shutdown signal, or when the engine thread dies (the
//! embedder then finds why in `EngineHandle::failure`): refuse new engine requests (503,
//! and /health turns 503 so load balancers route elsewhere), let running requests finish for
//! up to `shutdown_timeout`, then end the rest cleanly (finish_reason "abort", streams still
//! close with `data: [DONE]`). Background responses are running requests too: the drain
//! waits for them as for those on a connection. Connections are accepted until the last one
//! closes and the last background response has ended (see `connection`), so a client arriving
//! during the drain gets its 503 rather than a reset, and one polling a background response
//! gets its end.

use crate::app::{app, routes};
use crate::connection::{self, ConnectionLimits};
use crate::fd_limit::connection_capacity;
use crate::metrics::ServerMetrics;
use crate::responses_runs::Runs;
use crate::responses_store::ResponseStore;
use crate::served_model::ServedModel;
use crate::state::{AppState, ServerConfig};
use crate::text_workers::TextWorkers;
use axum::Router;
use peagle_engine::EngineHandle;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// After the shutdown timeout has ended the requests, how long connections get to flush
/// their last bytes before the server stops regardless (a client that stopped reading).
const FLUSH_GRACE: Duration = Duration::from_secs(5);

pub struct Server {
    state: Arc<AppState>,
    stopping: watch::Sender<bool>,
    abort: watch::Sender<bool>,
}

impl Server {
    /// Fails only when the text worker threads cannot start.
    pub fn new(engine: EngineHandle, model: ServedModel, config: ServerConfig) -> std::io::Result<Self> {
        let (stopping, stopping_rx) = watch::channel(false);
        let (abort, abort_rx) = watch::channel(false);
        let state = Arc::new(AppState {
            metrics: ServerMetrics::new(engine.max_model_len()),
            engine,
            text_workers: TextWorkers::start()?,
            model,
            responses: ResponseStore::new(config.responses_store_bytes),
            runs: Runs::default(),
            config,
            stopping: stopping_rx,
            abort: abort_rx,
        });
        Ok(Self { state, stopping, abort })
    }

    /// The API routes, to which an embedder may add its own before `serve_with`.
    pub fn routes(&self) -> Router {
        routes(self.state.clone())
    }

    /// Serves until `shutdown` completes and the running requests are done.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let routes = self.routes();
        self.serve_with(routes, listener, shutdown).await
    }

    pub async fn serve_with(
        self,
        routes: Router,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let config = &self.state.config;
        let app = app(routes, config).map_err(std::io::Error::other)?;
        let limits = ConnectionLimits {
            header_timeout: config.header_timeout,
            keep_alive_timeout: config.keep_alive_timeout,
            capacity: connection_capacity(),
        };
        let engine = self.state.engine.clone();
        let timeout = config.shutdown_timeout;
        let (stopping, abort) = (self.stopping, self.abort);
        tokio::spawn(async move {
            tokio::select! {
                _ = shutdown => {}
                why = engine.failed() => tracing::error!(why, "the engine died: shutting down"),
            }
            tracing::info!(?timeout, "shutting down: no new requests; waiting for running ones");
            engine.shutdown();
            let _ = stopping.send(true);
            tokio::time::sleep(timeout).await;
            tracing::warn!("shutdown timeout: ending the requests still running");
            let _ = abort.send(true);
        });
        let mut aborted = self.state.abort.clone();
        let deadline = async move {
            // An error means the shutdown task is gone without ending requests: no deadline.
            let fired = aborted.wait_for(|a| *a).await.is_ok();
            match fired {
                true => tokio::time::sleep(FLUSH_GRACE).await,
                false => std::future::pending().await,
            }
        };
        let background = self.state.runs.all_done();
        connection::serve(listener, app, limits, self.state.stopping.clone(), background, deadline).await;
        Ok(())
    }
}

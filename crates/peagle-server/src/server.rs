//! Serving and graceful shutdown. On the shutdown signal: stop accepting connections and
//! engine requests, let running requests finish for up to `shutdown_timeout`, then end the
//! rest cleanly (finish_reason "abort", streams still close with `data: [DONE]`).

use crate::app::{app, routes};
use crate::metrics::ServerMetrics;
use crate::served_model::ServedModel;
use crate::state::{AppState, ServerConfig};
use axum::serve::ListenerExt;
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
    abort: watch::Sender<bool>,
}

impl Server {
    pub fn new(engine: EngineHandle, model: ServedModel, config: ServerConfig) -> Self {
        let (abort, abort_rx) = watch::channel(false);
        let state = Arc::new(AppState {
            metrics: ServerMetrics::new(engine.max_model_len()),
            engine,
            model,
            config,
            abort: abort_rx,
        });
        Self { state, abort }
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
        let app = app(routes, &self.state.config).map_err(std::io::Error::other)?;
        let (stopping, mut stop) = watch::channel(false);
        let engine = self.state.engine.clone();
        let timeout = self.state.config.shutdown_timeout;
        let abort = self.abort;
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!(?timeout, "shutting down: no new requests; waiting for running ones");
            engine.shutdown();
            let _ = stopping.send(true);
            tokio::time::sleep(timeout).await;
            tracing::warn!("shutdown timeout: ending the requests still running");
            let _ = abort.send(true);
        });
        // Streams write a small chunk per token: with Nagle's algorithm on, each waited for
        // the client's delayed ACK (about 40 ms) on a reused connection and tokens came in bursts.
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::warn!(error = %e, "cannot set TCP_NODELAY on a connection");
            }
        });
        let graceful = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
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
        tokio::select! {
            result = graceful => result,
            _ = deadline => {
                tracing::warn!("connections still open after the shutdown timeout; closing them");
                Ok(())
            }
        }
    }
}

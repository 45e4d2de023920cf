//! Accepting and driving client connections, with the limits that keep one client from
//! holding the server: a request's headers must arrive within the header timeout, a
//! connection with nothing in flight that sends nothing for the keep-alive timeout is closed,
//! and at the open-file limit the connection idle the longest is shed for a newcomer.
//!
//! Shutdown: when `stop` turns true, open connections finish the request they are serving
//! and close; new connections are still accepted, one request each, so a client arriving at
//! that instant gets an answer (503 for new work) instead of a reset. Accepting ends once
//! every connection has closed and `unattended` (work that runs with no connection, such as
//! background responses, which clients poll) has completed, or when `deadline` completes.

mod automatic_response;
mod io;
mod registry;
mod tracked_body;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use io::ConnIo;
use registry::{Registered, Registry};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::ServiceExt;
use tracked_body::TrackedBody;

#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// A request's headers must arrive whole within this.
    pub header_timeout: Duration,
    /// A connection with no request in flight that sends nothing for this long is closed.
    pub keep_alive_timeout: Duration,
    /// Most connections held at once; beyond it the longest-idle one is shed.
    pub capacity: usize,
}

/// How long `accept` waits after running out of file descriptors, for a shed connection's
/// task to close its socket.
const FD_EXHAUSTED_PAUSE: Duration = Duration::from_millis(20);

pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
    unattended: impl Future<Output = ()>,
    deadline: impl Future<Output = ()>,
) {
    let registry = Registry::new(limits.capacity);
    let conn_stop = stop.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => on_accept(accepted, &registry, &app, limits, &conn_stop).await,
            _ = stopped(&mut stop) => break,
        }
    }
    tokio::pin!(deadline, unattended);
    let mut unattended_done = false;
    loop {
        let emptied = registry.emptied();
        if registry.len() == 0 && unattended_done {
            return;
        }
        tokio::select! {
            accepted = listener.accept() => on_accept(accepted, &registry, &app, limits, &conn_stop).await,
            _ = emptied => {}
            _ = &mut unattended, if !unattended_done => unattended_done = true,
            _ = &mut deadline => {
                tracing::warn!(
                    open = registry.len(),
                    unattended_done,
                    "connections or background work still open after the shutdown timeout; closing them"
                );
                return;
            }
        }
    }
}

async fn on_accept(
    accepted: std::io::Result<(TcpStream, SocketAddr)>,
    registry: &Arc<Registry>,
    app: &Router,
    limits: ConnectionLimits,
    stop: &watch::Receiver<bool>,
) {
    match accepted {
        Ok((stream, _)) => start(stream, registry, app, limits, stop),
        Err(e) => accept_failed(e, registry).await,
    }
}

fn start(
    stream: TcpStream,
    registry: &Arc<Registry>,
    app: &Router,
    limits: ConnectionLimits,
    stop: &watch::Receiver<bool>,
) {
    // Streams write a small chunk per token: with Nagle's algorithm on, each waited for the
    // client's delayed ACK (about 40 ms) on a reused connection and tokens came in bursts.
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(error = %e, "cannot set TCP_NODELAY on a connection");
    }
    match registry.register() {
        Some(registered) => {
            tokio::spawn(drive(stream, registered, app.clone(), limits, stop.clone()));
        }
        None => tracing::warn!(
            capacity = limits.capacity,
            "every connection is busy at the open-file limit; turning a new one away"
        ),
    }
}

async fn accept_failed(e: std::io::Error, registry: &Registry) {
    let exhausted = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
    if !exhausted {
        // The client went away between SYN and accept (ECONNABORTED and kin).
        tracing::debug!(error = %e, "accept failed");
        return;
    }
    let shed = registry.shed_one();
    tracing::warn!(error = %e, shed, "out of file descriptors at accept");
    tokio::time::sleep(FD_EXHAUSTED_PAUSE).await;
}

/// Serves one connection until it closes, is shed, or goes idle.
async fn drive(
    stream: TcpStream,
    registered: Registered,
    app: Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) {
    let slot = registered.slot.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let in_flight = slot.request_started();
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.unwrap_or_else(|never| match never {});
            Ok::<_, Infallible>(response.map(|body| Body::new(TrackedBody::new(body, in_flight))))
        }
    });
    let stopping = *stop.borrow();
    let io = TokioIo::new(ConnIo::new(stream, registered.slot.clone()));
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(!stopping)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let mut closing = stopping;
    loop {
        let idle = registered.slot.idle_for();
        let check_idle = tokio::time::sleep(limits.keep_alive_timeout.saturating_sub(idle));
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = registered.slot.shed.notified() => {
                tracing::debug!("shedding an idle connection at the open-file limit");
                return;
            }
            _ = stopped(&mut stop), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            // Nothing is in flight, so dropping the connection loses nothing; hyper's graceful
            // close would wait for the rest of a half-sent request head.
            _ = check_idle => {
                if registered.slot.idle_for() >= limits.keep_alive_timeout {
                    tracing::debug!("closing a connection idle past the keep-alive timeout");
                    return;
                }
            }
        }
    }
}

/// Completes once `stop` is true, or its sender is gone (nothing could stop it later).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

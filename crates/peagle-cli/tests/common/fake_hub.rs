//! A stand-in for the Hugging Face hub on loopback, serving fixture directories under
//! repository ids with the endpoints and headers hf-hub's client reads: the repository
//! info (`/api/models/ID/revision/main`) and ranged file downloads (`/ID/resolve/main/FILE`)
//! with `etag`, `x-repo-commit` and `content-range`, sent whole, a piece at a time, or cut off
//! halfway.

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How a file's bytes are sent. A one-byte range (the client's request for a file's size and
/// etag) is always sent at once.
#[derive(Clone, Copy)]
pub enum Pace {
    Whole,
    /// In this many pieces, each this long after the last.
    Pieces(usize, Duration),
    /// Half the bytes, and then nothing until the hub stops.
    StopHalfway,
}

/// The commit every repository is at.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

#[derive(Clone)]
struct Hub {
    repos: Arc<HashMap<String, std::path::PathBuf>>,
    /// Requests must carry `Authorization: Bearer TOKEN` when set.
    token: Option<String>,
    /// "FILE RANGE" for each file request served.
    log: Arc<Mutex<Vec<String>>>,
    pace: Pace,
    /// True once the hub stops: a file stopped halfway ends then.
    stopping: watch::Receiver<bool>,
}

pub struct FakeHub {
    pub url: String,
    log: Arc<Mutex<Vec<String>>>,
    stopping: watch::Sender<bool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeHub {
    /// Serves each (repository id, directory) pair until dropped.
    pub fn start(repos: &[(&str, std::path::PathBuf)], token: Option<&str>) -> Self {
        Self::start_paced(repos, token, Pace::Whole)
    }

    /// As `start`, sending files at `pace`.
    pub fn start_paced(repos: &[(&str, std::path::PathBuf)], token: Option<&str>, pace: Pace) -> Self {
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stopping, stopping_seen) = watch::channel(false);
        let state = Hub {
            repos: Arc::new(repos.iter().map(|(id, dir)| (id.to_string(), dir.clone())).collect()),
            token: token.map(str::to_owned),
            log: log.clone(),
            pace,
            stopping: stopping_seen,
        };
        let app = Router::new()
            .route("/api/models/{org}/{name}/revision/{rev}", get(info))
            .route("/{org}/{name}/resolve/{rev}/{*file}", get(file))
            .with_state(state);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async {
                axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            })
        });
        Self {
            url,
            log,
            stopping,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The file requests served so far, as "FILE RANGE".
    pub fn requests(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        // Responses still sending end first: the graceful shutdown waits for them.
        let _ = self.stopping.send(true);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn authorized(hub: &Hub, headers: &HeaderMap) -> bool {
    let sent = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match &hub.token {
        Some(token) => sent == Some(format!("Bearer {token}").as_str()),
        None => true,
    }
}

async fn info(
    State(hub): State<Hub>,
    Path((org, name, _rev)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&hub, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Some(dir) = hub.repos.get(&format!("{org}/{name}")) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let mut siblings: Vec<serde_json::Value> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| serde_json::json!({"rfilename": e.unwrap().file_name().to_string_lossy()}))
        .collect();
    siblings.push(serde_json::json!({"rfilename": "original/model.safetensors"}));
    Json(serde_json::json!({"sha": COMMIT, "siblings": siblings})).into_response()
}

async fn file(
    State(hub): State<Hub>,
    Path((org, name, _rev, file)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&hub, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let Some(bytes) = hub
        .repos
        .get(&format!("{org}/{name}"))
        .and_then(|dir| std::fs::read(dir.join(&file)).ok())
    else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    hub.log.lock().unwrap().push(format!("{file} {range}"));
    let (start, end) = parse_range(&range, bytes.len());
    let etag = format!("\"{}\"", etag(&bytes));
    let body = bytes[start..end].to_vec();
    let body = match hub.pace {
        Pace::Pieces(pieces, gap) if body.len() > 1 => paced(body, pieces, gap),
        Pace::StopHalfway if body.len() > 1 => stop_halfway(body, hub.stopping.clone()),
        _ => Body::from(body),
    };
    (
        StatusCode::PARTIAL_CONTENT,
        [
            (header::ETAG.as_str(), etag),
            ("x-repo-commit", COMMIT.to_string()),
            (
                header::CONTENT_RANGE.as_str(),
                format!("bytes {start}-{}/{}", end.max(start + 1) - 1, bytes.len()),
            ),
        ],
        body,
    )
        .into_response()
}

/// `bytes` in `pieces` pieces, each `gap` after the last.
fn paced(bytes: Vec<u8>, pieces: usize, gap: Duration) -> Body {
    let size = bytes.len().div_ceil(pieces);
    let chunks: Vec<Bytes> = bytes.chunks(size).map(Bytes::copy_from_slice).collect();
    Body::from_stream(futures_util::stream::iter(chunks).then(move |chunk| async move {
        tokio::time::sleep(gap).await;
        Ok::<_, std::io::Error>(chunk)
    }))
}

/// The first half of `bytes`; the rest never comes, and the body fails once the hub stops.
fn stop_halfway(bytes: Vec<u8>, mut stopping: watch::Receiver<bool>) -> Body {
    let half = Bytes::copy_from_slice(&bytes[..bytes.len() / 2]);
    let cut_off = async move {
        let _ = stopping.wait_for(|stopped| *stopped).await;
        Err(std::io::Error::other("the hub stopped"))
    };
    Body::from_stream(futures_util::stream::once(async { Ok(half) }).chain(futures_util::stream::once(cut_off)))
}

/// `bytes=A-B` or `bytes=A-` as a half-open range within `len`; the whole file without one.
fn parse_range(range: &str, len: usize) -> (usize, usize) {
    let Some((a, b)) = range.strip_prefix("bytes=").and_then(|r| r.split_once('-')) else {
        return (0, len);
    };
    let start = a.parse::<usize>().unwrap_or(0).min(len);
    let end = b.parse::<usize>().map_or(len, |b| (b + 1).min(len));
    (start, end.max(start))
}

/// The etag a file is served with, which names its blob in the cache.
pub fn etag(bytes: &[u8]) -> String {
    let fnv1a = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    });
    format!("{fnv1a:016x}{:08x}", bytes.len())
}

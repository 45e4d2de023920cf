//! `--api-key`: every path needs `Authorization: Bearer <key>`, unknown ones included (a 404
//! or 405 would tell a client without the key which routes exist); /health, /version and
//! /metrics stay open for probes and scrapers, as in vLLM, and so does /openapi.json.

use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;

/// Paths open without the key.
const OPEN_PATHS: [&str; 4] = ["/health", "/version", "/metrics", "/openapi.json"];

pub async fn require_api_key(
    State(key): State<Option<String>>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    // An empty key (`--api-key ''`, an unset variable) is no key, as vLLM takes it: no client
    // could ever send it.
    let Some(key) = key.as_ref().filter(|k| !k.is_empty()) else {
        return Ok(next.run(req).await);
    };
    if OPEN_PATHS.contains(&req.uri().path()) {
        return Ok(next.run(req).await);
    }
    let given = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(given) if same(given.as_bytes(), key.as_bytes()) => Ok(next.run(req).await),
        _ => Err(ApiError::unauthorized()),
    }
}

/// Compares in time independent of where the first difference is, so response timing does
/// not reveal the key byte by byte.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn same_compares_whole_keys() {
        assert!(super::same(b"sk-1", b"sk-1"));
        assert!(!super::same(b"sk-1", b"sk-2"));
        assert!(!super::same(b"sk-1", b"sk-10"));
    }
}

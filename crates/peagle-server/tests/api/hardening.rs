//! One client must not be able to hold the server for everyone else: slow and idle
//! connections are closed, bodies are read under a size and a time bound, a request's
//! fan-out is bounded, and every refusal is an OpenAI-style JSON error, even the ones made
//! before the app sees the request. Raw sockets, to send what HTTP clients never would.

use crate::common::{greedy, Options, TestServer};
use peagle_engine::GenerationDefaults;
use peagle_server::ServerConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

async fn connect(server: &TestServer) -> TcpStream {
    TcpStream::connect(server.url.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes the connection; panics if it has not within `within`.
async fn read_to_close(stream: &mut TcpStream, within: Duration) -> String {
    let mut bytes = Vec::new();
    timeout(within, stream.read_to_end(&mut bytes))
        .await
        .expect("the server kept the connection open")
        .expect("the connection was reset");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The status code and JSON error object of a raw HTTP/1.1 response.
fn json_error(response: &str) -> (u16, Value) {
    let status = response[9..12].parse().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(
        head.to_ascii_lowercase().contains("content-type: application/json"),
        "{head}"
    );
    let json: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"));
    (status, json["error"].clone())
}

fn config(change: impl FnOnce(&mut ServerConfig)) -> ServerConfig {
    let mut config = ServerConfig::default();
    change(&mut config);
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_after_the_keep_alive_timeout() {
    let server = TestServer::with_config(config(|c| c.keep_alive_timeout = Duration::from_secs(1))).await;
    let mut half_open = Vec::new();
    for _ in 0..50 {
        let mut stream = connect(&server).await;
        stream
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        half_open.push(stream);
    }
    assert_eq!(server.get("/health").await.status(), StatusCode::OK);
    for stream in &mut half_open {
        assert_eq!(read_to_close(stream, Duration::from_secs(5)).await, "");
    }
}

/// A client trickling its headers a byte at a time stays active, but not past the header
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_must_arrive_within_the_header_timeout() {
    let server = TestServer::with_config(config(|c| c.header_timeout = Duration::from_secs(1))).await;
    let mut stream = connect(&server).await;
    let trickle = async {
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ".iter().cycle() {
            if stream.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    timeout(Duration::from_secs(5), trickle)
        .await
        .expect("the server kept reading the trickled headers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_shorter_than_its_declared_length_gets_408() {
    let server = TestServer::with_config(config(|c| c.body_timeout = Duration::from_secs(1))).await;
    let mut stream = connect(&server).await;
    stream
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
        .await
        .unwrap();
    let response = read_to_close(&mut stream, Duration::from_secs(5)).await;
    let (status, error) = json_error(&response);
    assert_eq!(status, 408);
    assert_eq!(error["code"], "request_timeout");
}

/// A client that sends its whole oversized body before reading still reads the 413: closing
/// on unread data would reset the connection under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_sent_whole_still_gets_its_413() {
    let server = TestServer::with_config(config(|c| c.max_body_bytes = 1 << 20)).await;
    let body = vec![b' '; 16 << 20];
    let mut stream = connect(&server).await;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body).await.unwrap();
    let response = read_to_close(&mut stream, Duration::from_secs(10)).await;
    let (status, error) = json_error(&response);
    assert_eq!(status, 413);
    assert_eq!(error["code"], "request_too_large");
}

/// hyper refuses what it cannot parse before the app runs; those answers are JSON too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_are_not_http_get_json_errors() {
    let server = TestServer::start().await;
    let long_header = format!(
        "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let cases = [
        ("GET /health HTTP/1.1\r\nBad Header\r\n\r\n".to_string(), 400),
        ("GET /he alth HTTP/1.1\r\nHost: x\r\n\r\n".to_string(), 400),
        (long_header, 431),
    ];
    for (request, expected) in cases {
        let mut stream = connect(&server).await;
        // The server may close before reading all of a huge head; its answer is still there.
        let _ = stream.write_all(request.as_bytes()).await;
        let response = read_to_close(&mut stream, Duration::from_secs(5)).await;
        let (status, error) = json_error(&response);
        assert_eq!(status, expected, "{response}");
        assert_eq!(error["type"], "invalid_request_error");
    }
}

/// axum's own rejections (here a path segment that is not UTF-8) are JSON errors too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractor_rejections_are_json_errors() {
    let server = TestServer::start().await;
    let response = server.get("/v1/models/%FF").await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("UTF-8"), "{body}");
}

/// Without the key, nothing but the probes tells a client which routes exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_key_unknown_paths_and_methods_get_401() {
    let server = TestServer::with_config(config(|c| c.api_key = Some("sk-test".into()))).await;
    for response in [
        server.get("/v1/nope").await,
        server
            .client
            .delete(format!("{}/v1/models", server.url))
            .send()
            .await
            .unwrap(),
        server.get("/nope").await,
    ] {
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
    }
    assert_eq!(server.get("/health").await.status(), StatusCode::OK);
    assert_eq!(server.get("/metrics").await.status(), StatusCode::OK);
    let with_key = server
        .client
        .get(format!("{}/v1/nope", server.url))
        .bearer_auth("sk-test")
        .send()
        .await
        .unwrap();
    assert_eq!(with_key.status(), StatusCode::NOT_FOUND);
}

/// A client arriving while the server drains its running requests gets a 503 it can act on,
/// not a refused or reset connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_arriving_during_shutdown_gets_503() {
    let server = TestServer::with(Options {
        config: config(|c| c.shutdown_timeout = Duration::from_secs(60)),
        generation_defaults: GenerationDefaults::Neutral,
        ..Default::default()
    })
    .await;
    let mut long = greedy("import sys", 300);
    long["stream"] = json!(true);
    let mut running = server.post("/v1/completions").json(&long).send().await.unwrap();
    running.chunk().await.unwrap().expect("a first chunk");
    let (url, client) = (server.url.clone(), server.client.clone());
    let stopped = tokio::spawn(server.shutdown());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let late = client
        .post(format!("{url}/v1/completions"))
        .json(&greedy("hi", 2))
        .send()
        .await
        .expect("refused or reset during the drain");
    assert_eq!(late.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(late.headers()["retry-after"], "1");
    let error: Value = late.json().await.unwrap();
    assert_eq!(error["error"]["code"], "shutting_down");
    let health = client.get(format!("{url}/health")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::SERVICE_UNAVAILABLE);
    while running.chunk().await.unwrap().is_some() {}
    stopped.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_sequences_than_the_per_request_cap_get_400() {
    let server = TestServer::with_config(config(|c| c.max_sequences_per_request = 8)).await;
    let mut request = greedy("hi", 2);
    request["prompt"] = json!(["a", "b", "c"]);
    request["n"] = json!(3);
    let (status, body) = server.call("/v1/completions", request.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], "n");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("9 sequences"),
        "{body}"
    );
    request["n"] = json!(2);
    server.ok("/v1/completions", request).await;
}

/// The waiting limit counts sequences: a request whose choices do not fit in the room left
/// waits no more than a single one would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_limit_counts_every_sequence() {
    let server = TestServer::with(Options {
        max_waiting: Some(4),
        max_num_seqs: Some(1),
        generation_defaults: GenerationDefaults::Neutral,
        ..Default::default()
    })
    .await;
    let (running, waiting) = server.one_running_one_waiting().await;
    let mut fan_out = greedy("hi", 2);
    fan_out["n"] = json!(4);
    let (status, body) = server.call("/v1/completions", fan_out.clone()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "server_busy");
    fan_out["n"] = json!(3);
    let fits = tokio::spawn({
        let (url, client) = (server.url.clone(), server.client.clone());
        async move { client.post(format!("{url}/v1/completions")).json(&fan_out).send().await }
    });
    drop(running);
    assert_eq!(waiting.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(fits.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// A prompt too long in bytes to fit the context is refused without tokenizing it (the
/// message says "at least": its tokens were never counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_too_long_in_bytes_is_refused_before_tokenizing() {
    let server = TestServer::start().await;
    let mut request = greedy(&"x = 1\n".repeat(500_000), 1);
    let (status, body) = server.call("/v1/completions", request.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], "prompt");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("at least"),
        "{body}"
    );
    request["prompt"] = json!("x = 1\n".repeat(100));
    server.ok("/v1/completions", request).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_beyond_the_caps_get_400() {
    let server = TestServer::start().await;
    let mut request = greedy("def f(x):", 4);
    request["stop"] = json!((0..257).map(|i| format!("stop{i}")).collect::<Vec<_>>());
    let (status, body) = server.call("/v1/completions", request.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], "stop");
    request["stop"] = json!(["x".repeat(20 << 10)]);
    assert_eq!(
        server.call("/v1/completions", request.clone()).await.0,
        StatusCode::BAD_REQUEST
    );
    request["stop"] = json!((0..256).map(|i| format!("stop{i}")).collect::<Vec<_>>());
    server.ok("/v1/completions", request).await;
}

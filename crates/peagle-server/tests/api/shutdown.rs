//! Graceful shutdown: no new connections, running requests finish (or, past the timeout, end
//! cleanly with finish_reason "abort"), then the server returns.

use crate::common::{greedy, streamed, TestServer};
use peagle_server::ServerConfig;
use serde_json::json;
use std::time::Duration;

async fn stream_then_shutdown(timeout: Duration) -> Option<String> {
    let server = TestServer::with_config(ServerConfig {
        shutdown_timeout: timeout,
        ..Default::default()
    })
    .await;
    let mut request = greedy("def long(x):", 200);
    request["stream"] = json!(true);
    let mut response = server.post("/v1/completions").json(&request).send().await.unwrap();
    let mut text = String::from_utf8(response.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    let url = server.url.clone();
    let stopped = tokio::spawn(server.shutdown());
    while let Some(bytes) = response.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&bytes).unwrap());
    }
    stopped.await.unwrap().unwrap();
    assert!(reqwest::get(format!("{url}/health")).await.is_err(), "still accepting");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let chunks: Vec<_> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    streamed(&chunks, 0, "text").1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_streams_finish_before_the_server_stops() {
    let finish = stream_then_shutdown(Duration::from_secs(60)).await;
    assert_eq!(finish.as_deref(), Some("length"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_timeout_streams_end_cleanly() {
    let finish = stream_then_shutdown(Duration::ZERO).await;
    // Ended by the server unless it happened to finish first.
    assert!(matches!(finish.as_deref(), Some("abort" | "length")), "{finish:?}");
}

//! A client that disconnects mid-stream cancels its request: the engine frees its KV blocks.

use crate::common::{greedy, TestServer};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_stream_frees_its_kv_blocks() {
    let server = TestServer::start().await;
    let mut request = greedy("import sys", 200);
    request["stream"] = json!(true);
    let mut response = server.post("/v1/completions").json(&request).send().await.unwrap();
    let first = response.chunk().await.unwrap().expect("a first chunk");
    assert!(first.starts_with(b"data: {"), "{first:?}");
    drop(response);

    server.wait_for_metric("peagle:num_requests_running", 0.0).await;
    server.wait_for_metric("peagle:kv_blocks_used", 0.0).await;
    server
        .wait_for_metric("peagle:request_success_total{finished_reason=\"abort\"}", 1.0)
        .await;
    // Cancelled, not finished: far fewer than the 200 tokens asked for were generated.
    let generated = server.metric("peagle:generation_tokens_total").await;
    assert!(generated < 200.0, "{generated} tokens generated after the client left");
}

//! Continuous batching must not change greedy answers: 16+ concurrent requests each get
//! exactly the text they get alone (batch-invariant kernels, speculation included).

use crate::common::{greedy, texts, TestServer};
use futures_util::future::join_all;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_greedy_requests_match_their_solo_runs() {
    let server = TestServer::start().await;
    let requests: Vec<_> = (0..18)
        .map(|i| {
            let mut r = greedy(&format!("def task_{i}(x):\n    return"), 20 + i % 5);
            // Some without speculation, so plain and speculative rows share batches.
            if i % 3 == 0 {
                r["speculative"] = json!(false);
            }
            r
        })
        .collect();
    let mut alone = Vec::new();
    for r in &requests {
        alone.push(texts(&server.ok("/v1/completions", r.clone()).await));
    }
    let together = join_all(requests.iter().map(|r| server.ok("/v1/completions", r.clone()))).await;
    for (i, (solo, batched)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(solo, &texts(batched), "request {i} changed under load");
    }
}

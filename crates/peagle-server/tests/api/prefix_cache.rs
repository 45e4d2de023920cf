//! Prefix caching over HTTP: a request that shares a long prefix with an earlier one reports
//! the cached prompt tokens in its usage (as OpenAI does), /metrics counts the lookups and
//! hits (as vLLM does), and POST /reset_prefix_cache empties the cache. (Without a drafter:
//! a drafting request takes only blocks whose drafter rows were computed, which the engine
//! tests cover.)

use crate::common::{Options, TestServer};
use serde_json::{json, Value};

fn chat(question: &str, stream: bool) -> Value {
    let mut request = chat_request(question);
    if stream {
        request["stream"] = json!(true);
        request["stream_options"] = json!({"include_usage": true});
    }
    request
}

fn chat_request(question: &str) -> Value {
    let system = "You write short, correct Python functions with docstrings and type hints. \
                  Prefer the standard library. Name things clearly. Never print debug output.";
    json!({
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "temperature": 0,
        "max_tokens": 4,
    })
}

async fn cached_tokens(server: &TestServer, question: &str) -> u64 {
    let body = server.ok("/v1/chat/completions", chat(question, false)).await;
    body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefixes_are_reported_counted_and_reset() {
    let server = TestServer::with(Options {
        speculative: false,
        ..Default::default()
    })
    .await;
    assert_eq!(cached_tokens(&server, "Sort a list").await, 0);
    let hit = cached_tokens(&server, "Reverse a string").await;
    assert!(hit >= 16, "the system prompt's full blocks are cached: {hit}");

    let chunks = server
        .stream("/v1/chat/completions", chat("Merge two dicts", true))
        .await;
    let usage = &chunks.last().unwrap()["usage"];
    assert!(
        usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() >= 16,
        "{usage}"
    );

    let queries = server.metric("peagle:prefix_cache_queries_total").await;
    let hits = server.metric("peagle:prefix_cache_hits_total").await;
    assert!(queries > hits && hits >= 32.0, "{queries} {hits}");
    let rate = server.metric("peagle:prefix_cache_hit_rate").await;
    assert!((rate - hits / queries).abs() < 1e-9);

    let response = server.post("/reset_prefix_cache").send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(cached_tokens(&server, "Sort a list").await, 0);
}

/// `cache_salt`: a request finds only prefixes cached under its own salt; an empty one is a
/// 400 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_salt_shares_prefixes_only_with_the_same_salt() {
    let server = TestServer::with(Options {
        speculative: false,
        ..Default::default()
    })
    .await;
    let cached = |question: &str, salt: &str| {
        let mut request = chat(question, false);
        request["cache_salt"] = json!(salt);
        let server = &server;
        async move {
            let body = server.ok("/v1/chat/completions", request).await;
            body["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        }
    };
    assert_eq!(cached("Sort a list", "tenant-a").await, 0);
    assert_eq!(cached("Reverse a string", "tenant-b").await, 0);
    assert!(cached("Merge two dicts", "tenant-a").await >= 16);
    assert_eq!(
        cached_tokens(&server, "Split a path").await,
        0,
        "no salt is a salt of its own"
    );
    let mut empty = chat("Sort a list", false);
    empty["cache_salt"] = json!("");
    let (status, error) = server.call("/v1/chat/completions", empty).await;
    assert_eq!(status, reqwest::StatusCode::BAD_REQUEST);
    assert_eq!(error["error"]["param"], "cache_salt");
}

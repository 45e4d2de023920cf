//! /tokenize and /detokenize: the ids the generation routes use, and back.

use crate::common::{greedy, token_id, TestServer, MAX_MODEL_LEN, MODEL};
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_counts_what_the_generation_routes_count_and_detokenize_inverts_it() {
    let server = TestServer::start().await;
    let prompt = "def fibonacci(n):";
    let tokens = server.ok("/tokenize", json!({"model": MODEL, "prompt": prompt})).await;
    let ids: Vec<u64> = tokens["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(tokens["count"], ids.len());
    assert_eq!(tokens["max_model_len"], MAX_MODEL_LEN);
    let completion = server.ok("/v1/completions", greedy(prompt, 2)).await;
    assert_eq!(completion["usage"]["prompt_tokens"], ids.len());
    let bare = server
        .ok("/tokenize", json!({"prompt": " pass", "add_special_tokens": false}))
        .await;
    assert_eq!(bare["tokens"], json!([token_id(" pass")]));

    let text = server.ok("/detokenize", json!({"tokens": bare["tokens"]})).await;
    assert_eq!(text["prompt"], " pass");

    let messages = json!([{"role": "user", "content": "Sort a list"}]);
    let chat_tokens = server.ok("/tokenize", json!({"messages": messages})).await;
    let chat = server
        .ok("/v1/chat/completions", json!({"messages": messages, "max_tokens": 2}))
        .await;
    assert_eq!(chat["usage"]["prompt_tokens"], chat_tokens["count"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokenize_requests_get_errors() {
    let server = TestServer::start().await;
    let cases = [
        ("/tokenize", json!({}), StatusCode::BAD_REQUEST),
        (
            "/tokenize",
            json!({"prompt": "a", "messages": []}),
            StatusCode::BAD_REQUEST,
        ),
        ("/tokenize", json!({"prompt": 3}), StatusCode::BAD_REQUEST),
        (
            "/tokenize",
            json!({"model": "other", "prompt": "a"}),
            StatusCode::NOT_FOUND,
        ),
        ("/detokenize", json!({"tokens": [1, 100000]}), StatusCode::BAD_REQUEST),
        ("/detokenize", json!({"tokens": "abc"}), StatusCode::BAD_REQUEST),
    ];
    for (path, body, status) in cases {
        let (got, error) = server.call(path, body.clone()).await;
        assert_eq!(got, status, "{path} {body}: {error}");
        assert!(error["error"]["message"].is_string(), "{error}");
    }
}

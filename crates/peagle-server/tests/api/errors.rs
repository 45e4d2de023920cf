//! Every client error gets its status code and an OpenAI error object; a panic fails only its
//! own request.

use crate::common::{greedy, texts, Options, TestServer, MAX_MODEL_LEN, MODEL};
use axum::routing::get;
use axum::Router;
use peagle_engine::GenerationDefaults;
use peagle_server::ServerConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Checks the OpenAI error shape and returns the error object.
async fn error(response: reqwest::Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.unwrap();
    let error = &body["error"];
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.get("param").is_some() && error.get("code").is_some(), "{body}");
    error.clone()
}

async fn bad_request(server: &TestServer, path: &str, body: Value, param: Option<&str>) -> Value {
    let response = server.post(path).json(&body).send().await.unwrap();
    let error = error(response, StatusCode::BAD_REQUEST).await;
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["param"].as_str(), param, "{error}");
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_get_400_naming_the_field() {
    let server = TestServer::start().await;
    let cmpl = "/v1/completions";
    let with = |key: &str, value: Value| {
        let mut r = greedy("hello", 4);
        r[key] = value;
        r
    };
    let response = server
        .post(cmpl)
        .header("content-type", "application/json")
        .body("{\"prompt\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(
        error(response, StatusCode::BAD_REQUEST).await["type"],
        "invalid_request_error"
    );
    // A seed past 64 bits, which a JSON value here cannot hold.
    let response = server
        .post(cmpl)
        .header("content-type", "application/json")
        .body(r#"{"prompt": "x", "seed": 18446744073709551616}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(error(response, StatusCode::BAD_REQUEST).await["param"], "seed");
    bad_request(&server, cmpl, with("temperature", json!("hot")), Some("temperature")).await;
    bad_request(&server, cmpl, with("max_tokens", json!(1.5)), Some("max_tokens")).await;
    bad_request(&server, cmpl, with("prompt", json!({"text": "x"})), Some("prompt")).await;
    bad_request(&server, cmpl, json!({"max_tokens": 4}), None).await;
    bad_request(&server, cmpl, with("prompt", json!("")), Some("prompt")).await;
    bad_request(&server, cmpl, with("prompt", json!([])), Some("prompt")).await;
    bad_request(&server, cmpl, with("prompt", json!([1, 100000])), Some("prompt")).await;
    let too_long: Vec<String> = (0..3 * MAX_MODEL_LEN).map(|i| i.to_string()).collect();
    let too_long = too_long.join(" ");
    let e = bad_request(&server, cmpl, with("prompt", json!(too_long)), Some("prompt")).await;
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains(&format!("maximum context length is {MAX_MODEL_LEN}")),
        "{e}"
    );
    bad_request(&server, cmpl, with("max_tokens", json!(0)), Some("max_tokens")).await;
    bad_request(&server, cmpl, with("max_tokens", json!(-3)), Some("max_tokens")).await;
    bad_request(
        &server,
        cmpl,
        with("max_tokens", json!(MAX_MODEL_LEN)),
        Some("max_tokens"),
    )
    .await;
    // Each field wrong on its own; the 400 names it (a wrongly typed map value by its path).
    for (key, value, param) in [
        ("temperature", json!(-0.1), "temperature"),
        ("top_p", json!(1.5), "top_p"),
        ("n", json!(0), "n"),
        ("n", json!(17), "n"),
        ("logprobs", json!(21), "logprobs"),
        ("stop", json!(3), "stop"),
        ("min_p", json!(1.5), "min_p"),
        ("presence_penalty", json!(2.5), "presence_penalty"),
        ("frequency_penalty", json!(-2.5), "frequency_penalty"),
        ("repetition_penalty", json!(0), "repetition_penalty"),
        ("logit_bias", json!({"x": 1}), "logit_bias"),
        ("logit_bias", json!({"100000": 1}), "logit_bias"),
        ("logit_bias", json!({"5": 101}), "logit_bias"),
        ("logit_bias", json!({"5": "up"}), "logit_bias.5"),
        ("stop_token_ids", json!([100000]), "stop_token_ids"),
        ("seed", json!(1.5), "seed"),
        ("min_tokens", json!(-1), "min_tokens"),
        // More than max_tokens (4) can give.
        ("min_tokens", json!(5), "min_tokens"),
        ("best_of", json!(3), "best_of"),
        ("suffix", json!("}"), "suffix"),
        ("prompt_logprobs", json!(21), "prompt_logprobs"),
        ("prompt_logprobs", json!(-1), "prompt_logprobs"),
        ("stream_options", json!({"include_usage": true}), "stream_options"),
        ("guided_regex", json!("[0-9"), "guided_regex"),
        ("guided_grammar", json!("root ::= [0-9"), "guided_grammar"),
        ("allowed_token_ids", json!([]), "allowed_token_ids"),
        ("allowed_token_ids", json!([5, 100000]), "allowed_token_ids"),
        ("allowed_token_ids", json!([-1]), "allowed_token_ids[0]"),
        ("bad_words", json!(["  "]), "bad_words"),
        ("bad_words", json!("import"), "bad_words"),
        ("use_beam_search", json!(true), "use_beam_search"),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "now"}}]),
            "tools",
        ),
        ("functions", json!([{"name": "now"}]), "functions"),
        ("tool_choice", json!("required"), "tool_choice"),
    ] {
        bad_request(&server, cmpl, with(key, value), Some(param)).await;
    }

    let chat = "/v1/chat/completions";
    let message = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
    bad_request(&server, chat, json!({"messages": []}), Some("messages")).await;
    bad_request(&server, chat, json!({"messages": "hi"}), Some("messages")).await;
    bad_request(&server, chat, message(json!(too_long)), Some("messages")).await;
    let image = json!([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]);
    bad_request(&server, chat, message(image), Some("messages[0].content")).await;
    let mut r = message(json!("hi"));
    r["top_logprobs"] = json!(2);
    bad_request(&server, chat, r, Some("top_logprobs")).await;
    let mut r = message(json!("hi"));
    r["max_completion_tokens"] = json!(0);
    bad_request(&server, chat, r, Some("max_completion_tokens")).await;
    let mut r = message(json!("hi"));
    // Tools need a harmony (gpt-oss) model or a tool call parser; this server has neither.
    r["tools"] = json!([{"type": "function", "function": {"name": "now", "parameters": {}}}]);
    bad_request(&server, chat, r.clone(), Some("tools")).await;
    r["tool_choice"] = json!("none");
    r["max_tokens"] = json!(4);
    let body = server.ok(chat, r).await;
    assert_eq!(body["choices"][0]["message"]["role"], "assistant", "{body}");
    let mut r = message(json!("hi"));
    r["response_format"] = json!({"type": "yaml"});
    bad_request(&server, chat, r, Some("response_format")).await;
    let mut r = message(json!("hi"));
    r["tool_choice"] = json!("required");
    bad_request(&server, chat, r, Some("tool_choice")).await;
    // A past tool call and its result: the template would render the turns without them.
    let call = json!({"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}});
    let turns = json!([
        {"role": "user", "content": "what time is it?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "noon"},
    ]);
    bad_request(
        &server,
        chat,
        json!({"messages": turns}),
        Some("messages[1].tool_calls"),
    )
    .await;
    let results = json!([{"role": "user", "content": "hi"}, {"role": "tool", "content": "noon"}]);
    bad_request(&server, chat, json!({"messages": results}), Some("messages[1].role")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_models_routes_methods_and_content_types() {
    let server = TestServer::start().await;
    let mut request = greedy("hello", 4);
    request["model"] = json!("gpt-5");
    let response = server.post("/v1/completions").json(&request).send().await.unwrap();
    let e = error(response, StatusCode::NOT_FOUND).await;
    assert_eq!(
        (e["code"].as_str(), e["param"].as_str()),
        (Some("model_not_found"), Some("model"))
    );
    assert!(e["message"].as_str().unwrap().contains("gpt-5"), "{e}");
    let response = server
        .post("/v1/chat/completions")
        .json(&json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    error(response, StatusCode::NOT_FOUND).await;

    error(server.get("/v1/nothing").await, StatusCode::NOT_FOUND).await;
    error(server.get("/v1/completions").await, StatusCode::METHOD_NOT_ALLOWED).await;
    let response = server
        .post("/v1/completions")
        .header("content-type", "text/plain")
        .body(greedy("hello", 4).to_string())
        .send()
        .await
        .unwrap();
    error(response, StatusCode::UNSUPPORTED_MEDIA_TYPE).await;

    let models = server.get("/v1/models").await.json::<Value>().await.unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["max_model_len"], MAX_MODEL_LEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_limit_get_413() {
    let config = ServerConfig {
        max_body_bytes: 1024,
        ..Default::default()
    };
    let server = TestServer::with(Options {
        config,
        ..Default::default()
    })
    .await;
    let response = server
        .post("/v1/completions")
        .json(&greedy(&"y".repeat(2000), 4))
        .send()
        .await
        .unwrap();
    error(response, StatusCode::PAYLOAD_TOO_LARGE).await;
    server.ok("/v1/completions", greedy("small", 2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_guards_the_v1_routes() {
    let config = ServerConfig {
        api_key: Some("sk-test".into()),
        ..Default::default()
    };
    let server = TestServer::with(Options {
        config,
        ..Default::default()
    })
    .await;
    let body = greedy("hi", 2);
    let missing = server.post("/v1/completions").json(&body).send().await.unwrap();
    assert_eq!(
        error(missing, StatusCode::UNAUTHORIZED).await["code"],
        "invalid_api_key"
    );
    let wrong = server
        .post("/v1/completions")
        .bearer_auth("sk-nope")
        .json(&body)
        .send()
        .await
        .unwrap();
    error(wrong, StatusCode::UNAUTHORIZED).await;
    error(server.get("/v1/models").await, StatusCode::UNAUTHORIZED).await;
    let tokenize = server
        .post("/tokenize")
        .json(&json!({"prompt": "hi"}))
        .send()
        .await
        .unwrap();
    error(tokenize, StatusCode::UNAUTHORIZED).await;
    let right = server
        .post("/v1/completions")
        .bearer_auth("sk-test")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), StatusCode::OK);
    // Probes and scrapers need no key.
    assert_eq!(server.get("/health").await.status(), StatusCode::OK);
    assert_eq!(server.get("/metrics").await.status(), StatusCode::OK);
    let version: serde_json::Value = server.get("/version").await.json().await.unwrap();
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"));

    // An empty key is no key.
    let open = TestServer::with_config(ServerConfig {
        api_key: Some(String::new()),
        ..Default::default()
    })
    .await;
    assert_eq!(
        open.post("/v1/completions").json(&body).send().await.unwrap().status(),
        StatusCode::OK
    );
}

/// One sequence runs and one waits; a third request finds the queue full. The waiting one is
/// served once the running one goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_gets_503() {
    let server = TestServer::with(Options {
        max_waiting: Some(1),
        max_num_seqs: Some(1),
        generation_defaults: GenerationDefaults::Neutral,
        ..Default::default()
    })
    .await;
    let (running, waiting) = server.one_running_one_waiting().await;
    let response = server
        .post("/v1/completions")
        .json(&greedy("hi", 2))
        .send()
        .await
        .unwrap();
    let e = error(response, StatusCode::SERVICE_UNAVAILABLE).await;
    assert_eq!(e["code"], "server_busy");

    drop(running);
    let served = waiting.await.unwrap().unwrap();
    assert_eq!(served.status(), StatusCode::OK);
}

/// The queue limit counts a response's choices once: a request with more choices than the
/// limit still gets in while the queue is below it, where a check per choice refused it forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_more_choices_than_the_queue_limit_is_served() {
    let server = TestServer::with(Options {
        max_waiting: Some(1),
        ..Default::default()
    })
    .await;
    let mut request = greedy("hi", 2);
    request["n"] = json!(3);
    request["prompt"] = json!(["a", "b"]);
    assert_eq!(texts(&server.ok("/v1/completions", request).await).len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_only_its_request() {
    async fn boom() -> &'static str {
        panic!("kaboom")
    }
    let extra = Router::new().route("/boom", get(boom));
    let server = TestServer::with(Options {
        extra: Some(extra),
        ..Default::default()
    })
    .await;
    let e = error(server.get("/boom").await, StatusCode::INTERNAL_SERVER_ERROR).await;
    assert_eq!(e["type"], "server_error");
    assert_eq!(server.get("/health").await.status(), StatusCode::OK);
    server.ok("/v1/completions", greedy("still here", 3)).await;
}

/// Browsers may call the API (CORS, vLLM's defaults): a preflight needs no API key, and only
/// the allowed origins are told they may read the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browsers_may_call_from_the_allowed_origins() {
    let preflight = |server: &TestServer, origin: &str| {
        server
            .client
            .request(reqwest::Method::OPTIONS, format!("{}/v1/chat/completions", server.url))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "authorization, content-type")
            .send()
    };
    let allowed = |r: &reqwest::Response| {
        r.headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().unwrap().to_string())
    };
    let anywhere = TestServer::with_config(ServerConfig {
        api_key: Some("sk-test".into()),
        ..Default::default()
    })
    .await;
    let response = preflight(&anywhere, "http://ui.example").await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(allowed(&response).as_deref(), Some("*"));
    // Named, since a `*` does not cover Authorization in browsers.
    let headers = response.headers()["access-control-allow-headers"].to_str().unwrap();
    assert!(headers.contains("authorization"), "{headers}");
    let health = anywhere
        .client
        .get(format!("{}/health", anywhere.url))
        .header("origin", "http://ui.example")
        .send()
        .await
        .unwrap();
    assert_eq!(allowed(&health).as_deref(), Some("*"));

    let listed = TestServer::with_config(ServerConfig {
        allowed_origins: vec!["http://ui.example".into()],
        ..Default::default()
    })
    .await;
    let response = preflight(&listed, "http://ui.example").await.unwrap();
    assert_eq!(allowed(&response).as_deref(), Some("http://ui.example"));
    let response = preflight(&listed, "http://elsewhere.example").await.unwrap();
    assert_eq!(allowed(&response), None);
}

/// Details of HTTP that clients rely on: a body without a content type is JSON (as FastAPI
/// reads it), a model's card is at /v1/models/{id}, and X-Request-Id names the response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_model_cards_and_untyped_bodies() {
    let server = TestServer::start().await;
    let untyped = server
        .post("/v1/completions")
        .header("x-request-id", "trace-42")
        .body(greedy("hi", 2).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(untyped.status(), StatusCode::OK);
    // Only --enable-request-id-headers puts the id on responses.
    assert!(untyped.headers().get("x-request-id").is_none());
    let body: Value = untyped.json().await.unwrap();
    assert_eq!(body["id"], "cmpl-trace-42");
    let card: Value = server.get(&format!("/v1/models/{MODEL}")).await.json().await.unwrap();
    assert_eq!(
        (card["id"].as_str(), card["object"].as_str()),
        (Some(MODEL), Some("model"))
    );
    let permission = &card["permission"][0];
    assert_eq!(permission["object"], "model_permission");
    assert!(permission["id"].as_str().unwrap().starts_with("modelperm-"));
    let missing = server.get("/v1/models/gpt-4").await;
    assert_eq!(error(missing, StatusCode::NOT_FOUND).await["code"], "model_not_found");
    // A name with a slash (a hub id) is a model's name too, not another route.
    let hub_id = server.get("/v1/models/openai/gpt-oss-20b").await;
    assert_eq!(error(hub_id, StatusCode::NOT_FOUND).await["code"], "model_not_found");
}

/// `--enable-request-id-headers`: each response carries the client's X-Request-Id or a new
/// one, which then also names the completion; errors carry it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_id_headers_name_every_response() {
    let server = TestServer::with_config(ServerConfig {
        request_id_headers: true,
        ..Default::default()
    })
    .await;
    let header = |r: &reqwest::Response| r.headers()["x-request-id"].to_str().unwrap().to_string();
    let given = server
        .post("/v1/completions")
        .header("x-request-id", "trace-7")
        .json(&greedy("hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&given), "trace-7");

    let fresh = server
        .post("/v1/completions")
        .json(&greedy("hi", 2))
        .send()
        .await
        .unwrap();
    let id = header(&fresh);
    assert!(id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    let body: Value = fresh.json().await.unwrap();
    assert_eq!(body["id"], format!("cmpl-{id}"));

    let mut wrong = greedy("hi", 2);
    wrong["model"] = json!("gpt-4");
    let refused = server.post("/v1/completions").json(&wrong).send().await.unwrap();
    assert_eq!(header(&refused).len(), 32);
    error(refused, StatusCode::NOT_FOUND).await;
}

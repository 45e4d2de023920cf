//! The benchmark against a real peagle server on a loopback port: the tiny Llama fixture with its
//! P-EAGLE drafter, so the speculative-decoding counters are exported and move.

use peagle_bench::{run, write_report, BenchConfig, BenchError, Endpoint, Workload};
use peagle_server::{start_engine, Server, ServerConfig};
use peagle_server::{DraftModel, EngineBuilder};
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// Serves the fixture on 127.0.0.1:0; returns its URL.
async fn start_server() -> String {
    let mut opts = EngineBuilder::new(fixture("tiny-llama"));
    opts.draft = Some(DraftModel {
        dir: fixture("tiny-llama-peagle"),
        k: Some(3),
        parallel: true,
    });
    // The fixture's drafter is random: left adaptive, the server would rightly stop drafting.
    opts.scheduler.adaptive_k = false;
    let (engine, model) = start_engine("tiny-llama".into(), &opts, None, Default::default()).unwrap();
    let server = Server::new(engine, model, ServerConfig::default()).unwrap();
    let routes = server.routes();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(server.serve_with(routes, listener, std::future::pending()));
    url
}

fn config(url: String, dataset: PathBuf) -> BenchConfig {
    config_for(url, dataset, Endpoint::Completions)
}

fn config_for(url: String, dataset: PathBuf, endpoint: Endpoint) -> BenchConfig {
    BenchConfig {
        url,
        model: None,
        workload: Workload {
            dataset,
            num_prompts: 6,
            concurrency: vec![1, 3],
            max_tokens: 8,
            temperature: 0.0,
            endpoint,
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn benchmarks_a_speculative_server() {
    let url = start_server().await;
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("prompts.jsonl");
    // Four prompts for six requests: the dataset cycles.
    let lines = ["def add(a, b):", "import os\n", "class Point:", "for i in range(10):"];
    let jsonl: String = lines
        .iter()
        .map(|p| format!("{}\n", serde_json::json!({"prompt": p})))
        .collect();
    std::fs::write(&dataset, jsonl).unwrap();

    let result = run(&config(url, dataset)).await.unwrap();
    assert_eq!(result.model, "tiny-llama");
    assert_eq!(result.levels.len(), 2);
    for level in &result.levels {
        assert_eq!(level.completed, 6);
        assert_eq!(level.total_output_tokens, 6 * 8);
        assert!(level.output_throughput > 0.0);
        let ttft = level.ttft_ms.unwrap();
        assert!(ttft.p50 > 0.0 && ttft.p50 <= ttft.p99, "{ttft:?}");
        assert!(level.spec_decode_drafts.unwrap() > 0.0);
        let acceptance = level.acceptance_length.unwrap();
        assert!((1.0..=4.0).contains(&acceptance), "{acceptance}");
        assert_eq!(level.mean_draft_length, Some(3.0), "k is fixed at 3");
        let engine = level.engine.unwrap();
        assert!(engine.steps >= 6.0 * 8.0 / 4.0, "{engine:?}");
        assert!(engine.target_ms > 0.0 && engine.drafter_ms > 0.0, "{engine:?}");
        assert!(engine.verify_ms >= 0.0 && engine.other_ms >= 0.0, "{engine:?}");
        assert!(engine.busy_fraction > 0.0 && engine.busy_fraction <= 1.0, "{engine:?}");
    }

    let out = dir.path().join("out");
    write_report(&result, &out).unwrap();
    let json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    assert_eq!(json["config"]["num_prompts"], 6);
    assert_eq!(json["config"]["concurrency"], serde_json::json!([1, 3]));
    assert_eq!(json["model"], "tiny-llama");
    for (level, concurrency) in json["levels"].as_array().unwrap().iter().zip([1, 3]) {
        assert_eq!(level["concurrency"], concurrency);
        for key in ["request_throughput", "output_throughput", "acceptance_length"] {
            assert!(level[key].is_f64(), "{key} in {level}");
        }
        for key in ["ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"] {
            for stat in ["mean", "p50", "p90", "p99"] {
                assert!(level[key][stat].is_f64(), "{key}.{stat} in {level}");
            }
        }
    }
    for plot in ["throughput.png", "latency.png"] {
        let bytes = std::fs::read(out.join(plot)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{plot}");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        summary.contains("| concurrency | completed | failed | req/s | output tok/s |"),
        "{summary}"
    );
    assert!(
        summary.contains("| concurrency | steps | output tokens/step | target |"),
        "{summary}"
    );
    let rows: Vec<&str> = summary
        .lines()
        .filter(|l| l.starts_with("| 1 |") || l.starts_with("| 3 |"))
        .collect();
    assert_eq!(rows.len(), 2 * 2, "one row per level in each table: {summary}");
}

/// Chat requests stream `delta.content`: every token is counted and timed the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn benchmarks_the_chat_endpoint() {
    let url = start_server().await;
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("prompts.jsonl");
    std::fs::write(&dataset, "{\"prompt\": \"Write a function that adds two numbers.\"}\n").unwrap();
    let result = run(&config_for(url, dataset, Endpoint::Chat)).await.unwrap();
    for level in &result.levels {
        assert_eq!(level.completed, 6);
        assert_eq!(level.total_output_tokens, 6 * 8);
        assert!(level.ttft_ms.unwrap().p50 > 0.0);
        assert!(level.itl_ms.unwrap().mean > 0.0);
    }
}

#[tokio::test]
async fn unreachable_server_is_an_error() {
    // A port that was just free: nothing listens on it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("prompts.jsonl");
    std::fs::write(&dataset, "{\"prompt\": \"x\"}\n").unwrap();
    let error = run(&config(url, dataset)).await.unwrap_err();
    assert!(matches!(error, BenchError::Unreachable { .. }), "{error}");
}

/// An OpenAI-style server on a loopback port that streams a one-token completion for its first
/// `good` requests and answers 500 after: a level that fails after another finished.
fn failing_after(good: usize) -> String {
    failing_where(move |i| i >= good)
}

/// The same server, answering 500 to the completions `fails` picks by their index.
fn failing_where(fails: impl Fn(usize) -> bool + Send + 'static) -> String {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut completions = 0;
        for socket in listener.incoming() {
            let mut socket = socket.unwrap();
            let mut reader = BufReader::new(socket.try_clone().unwrap());
            let mut head = String::new();
            let mut body_len = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                if let Some(n) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    body_len = n.trim().parse().unwrap();
                }
                head.push_str(&line);
            }
            reader.read_exact(&mut vec![0; body_len]).unwrap();
            let (status, kind, body) = if head.starts_with("GET /v1/models") {
                ("200 OK", "application/json", r#"{"data":[{"id":"m"}]}"#.to_string())
            } else if head.starts_with("POST /v1/completions") && !fails(completions) {
                completions += 1;
                let chunk = r#"{"choices":[{"index":0,"text":"x","finish_reason":"length"}]}"#;
                (
                    "200 OK",
                    "text/event-stream",
                    format!("data: {chunk}\n\ndata: [DONE]\n\n"),
                )
            } else if head.starts_with("POST") {
                completions += 1;
                ("500 Internal Server Error", "application/json", "{}".to_string())
            } else {
                ("404 Not Found", "application/json", "{}".to_string())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes());
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_level_keeps_the_levels_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("prompts.jsonl");
    std::fs::write(&dataset, "{\"prompt\": \"x\"}\n").unwrap();
    let mut config = config(failing_after(6), dataset.clone());
    config.workload.max_tokens = 1;
    let result = run(&config).await.unwrap();
    assert_eq!(result.levels.len(), 1);
    assert_eq!(result.levels[0].concurrency, 1);
    let failed = result.failed.as_deref().unwrap();
    assert!(
        failed.starts_with("concurrency 3: ") && failed.contains("500"),
        "{failed}"
    );
    let out = dir.path().join("report");
    write_report(&result, &out).unwrap();
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        summary.contains("- concurrency 3: ") && summary.contains("the run stopped there"),
        "{summary}"
    );
    // A first level that fails is the error itself.
    let error = run(&config_for(failing_after(0), dataset, Endpoint::Completions))
        .await
        .unwrap_err();
    assert!(matches!(error, BenchError::Status { status: 500, .. }), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_requests_are_counted_and_the_level_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("prompts.jsonl");
    std::fs::write(&dataset, "{\"prompt\": \"x\"}\n").unwrap();
    // Every other completion fails: 3 of the first level's 6, then 3 of the second's.
    let mut config = config(failing_where(|i| i % 2 == 1), dataset);
    config.workload.max_tokens = 1;
    let result = run(&config).await.unwrap();
    assert!(result.failed.is_none());
    assert_eq!(result.levels.len(), 2);
    for level in &result.levels {
        assert_eq!(
            (level.completed, level.failed),
            (3, 3),
            "concurrency {}",
            level.concurrency
        );
        assert_eq!(level.total_output_tokens, 3);
        let error = level.first_error.as_deref().unwrap();
        assert!(error.contains("answered 500"), "{error}");
    }
    let failures = result.failures();
    assert_eq!(failures.len(), 2);
    assert!(
        failures[0].starts_with("concurrency 1: 3 of 6 requests failed, the first with: "),
        "{failures:?}"
    );

    let out = dir.path().join("report");
    write_report(&result, &out).unwrap();
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("- concurrency 3: 3 of 6 requests failed"), "{summary}");
    assert!(summary.contains("\n| 3 | 3 | 3 | "), "{summary}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("result.json")).unwrap()).unwrap();
    assert_eq!(json["levels"][1]["failed"], 3);
}

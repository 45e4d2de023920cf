//! /metrics exports where the engine's time goes, by phase, per-choice lengths and latencies, and the
//! counters move with work.

use crate::common::{greedy, Options, TestServer};
use peagle_engine::GenerationDefaults;
use reqwest::StatusCode;
use serde_json::json;
use std::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_time_by_phase_moves_with_work() {
    let server = TestServer::start().await;
    let phase = |p: &str| format!("peagle:engine_step_seconds_total{{phase=\"{p}\"}}");
    let steps_before = server.metric("peagle:engine_steps_total").await;
    let target_before = server.metric(&phase("target")).await;
    server.ok("/v1/completions", greedy("def main():", 16)).await;
    let steps = server.metric("peagle:engine_steps_total").await - steps_before;
    // At least a prefill step, and at most one step per token after it.
    assert!((2.0..=16.0).contains(&steps), "{steps} steps");
    assert!(server.metric(&phase("target")).await > target_before);
    // The demo serves with its P-EAGLE drafter, so the drafter ran too.
    assert!(server.metric(&phase("drafter")).await > 0.0);
    for p in ["verify", "other"] {
        assert!(server.metric(&phase(p)).await >= 0.0);
    }
}

/// vLLM's per-request histograms: prompt and generated tokens per choice, and time per
/// output token after the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_choice_lengths_and_time_per_output_token() {
    let server = TestServer::start().await;
    let mut request = greedy("def f(x):", 6);
    request["n"] = json!(2);
    let body = server.ok("/v1/completions", request).await;
    let prompt_tokens = body["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_eq!(server.metric("peagle:request_generation_tokens_count").await, 2.0);
    assert_eq!(server.metric("peagle:request_generation_tokens_sum").await, 12.0);
    assert_eq!(
        server.metric("peagle:request_prompt_tokens_sum").await,
        2.0 * prompt_tokens
    );
    assert_eq!(
        server.metric("peagle:request_generation_tokens_bucket{le=\"5\"}").await,
        0.0
    );
    assert_eq!(
        server
            .metric("peagle:request_generation_tokens_bucket{le=\"10\"}")
            .await,
        2.0
    );
    assert_eq!(server.metric("peagle:time_per_output_token_seconds_count").await, 2.0);
    assert!(server.metric("peagle:time_per_output_token_seconds_sum").await > 0.0);
}

/// vLLM's request phases: a request that waits behind another shows it as queue time, and
/// each request's phases add up to its latency.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_prefill_decode_and_inference_times() {
    let server = TestServer::with(Options {
        max_num_seqs: Some(1),
        generation_defaults: GenerationDefaults::Neutral,
        ..Default::default()
    })
    .await;
    let (mut running, queued) = server.one_running_one_waiting().await;
    let waiting_since = Instant::now();
    while running.chunk().await.unwrap().is_some() {}
    let waited = waiting_since.elapsed().as_secs_f64();
    assert_eq!(queued.await.unwrap().unwrap().status(), StatusCode::OK);

    let mut sums = Vec::new();
    for phase in ["queue", "prefill", "decode", "inference"] {
        let count = format!("peagle:request_{phase}_time_seconds_count");
        server.wait_for_metric(&count, 2.0).await;
        sums.push(server.metric(&format!("peagle:request_{phase}_time_seconds_sum")).await);
    }
    let [queue, prefill, decode, inference] = sums[..] else {
        unreachable!()
    };
    // The second request waited at least until the first ended, less the time its end took to
    // reach this client.
    assert!(queue >= waited / 2.0, "queue time {queue} s, waited {waited} s");
    let e2e = server.metric("peagle:e2e_request_latency_seconds_sum").await;
    let tolerance = 1e-3;
    assert!(
        (queue + inference - e2e).abs() < tolerance,
        "{queue} + {inference} against {e2e}"
    );
    assert!(
        (prefill + decode - inference).abs() < tolerance,
        "{prefill} + {decode} against {inference}"
    );
}

//! Background responses: the request returns the response queued; polling finds it as the
//! same request answered in the foreground; its events are streamed again whole or from a
//! sequence number, while it runs and after; a cancel stops it in the engine and is
//! idempotent, and a delete cancels it first; a graceful stop waits for it; and what cannot be
//! run so is refused.

use crate::common::{greedy, Options, TestServer};
use crate::responses::{items, rebuilt, request, sse_events};
use peagle_server::{GenerationDefaults, ServerConfig};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn background(max_output_tokens: usize) -> Value {
    let mut body = request(max_output_tokens);
    body["background"] = json!(true);
    body
}

/// GET `path` as JSON.
async fn read(server: &TestServer, path: &str) -> Value {
    let response = server.get(path).await;
    assert_eq!(response.status(), 200, "{path}");
    response.json().await.unwrap()
}

/// Polls the response `id` until it is no longer queued or in progress.
async fn ended(server: &TestServer, id: &str) -> Value {
    let start = Instant::now();
    loop {
        let response = read(server, &format!("/v1/responses/{id}")).await;
        if !matches!(response["status"].as_str(), Some("queued" | "in_progress")) {
            return response;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "still {response}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A stream read again: the events of GET `path` (with `stream=true`).
async fn streamed_again(server: &TestServer, path: &str) -> Vec<Value> {
    let response = server.get(path).await;
    assert_eq!(response.status(), 200, "{path}");
    sse_events(&response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_is_polled_and_streamed_again_as_answered() {
    let server = TestServer::start().await;
    let foreground = server.ok("/v1/responses", request(6)).await;
    let queued = server.ok("/v1/responses", background(6)).await;
    assert_eq!(
        (&queued["status"], &queued["background"]),
        (&json!("queued"), &json!(true))
    );
    assert_eq!(queued["output"], json!([]));
    let id = queued["id"].as_str().unwrap();
    let done = ended(&server, id).await;
    assert_eq!(done["status"], "incomplete", "cut at max_output_tokens");
    assert_eq!(items(&done), items(&foreground));
    // Usage alike but for the prefix cache, which the foreground answer filled.
    assert_eq!(done["usage"]["output_tokens"], foreground["usage"]["output_tokens"]);
    assert_eq!(done["usage"]["input_tokens"], foreground["usage"]["input_tokens"]);

    // Its events, whole: from queued to incomplete, numbered from 0, rebuilding its items.
    let path = format!("/v1/responses/{id}?stream=true");
    let all = streamed_again(&server, &path).await;
    let kinds: Vec<&str> = all.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..2], ["response.created", "response.in_progress"]);
    assert_eq!(all[0]["response"]["status"], "queued");
    assert_eq!(kinds.last(), Some(&"response.incomplete"));
    assert_eq!(all.last().unwrap()["response"], done);
    for (i, event) in all.iter().enumerate() {
        assert_eq!(event["sequence_number"], i, "{event}");
    }
    assert_eq!(rebuilt(&all), items(&done));
    // From a sequence number: the events after it.
    let later = streamed_again(&server, &format!("{path}&starting_after=2")).await;
    assert_eq!(later[..], all[3..]);
    assert!(streamed_again(&server, &format!("{path}&starting_after=100000"))
        .await
        .is_empty());
    let bad = server.get(&format!("{path}&starting_after=-2")).await;
    assert_eq!(bad.status(), 400);

    // Cancelling one that ended gives it back as it ended, again and again.
    let cancel = format!("/v1/responses/{id}/cancel");
    assert_eq!(server.ok(&cancel, json!({})).await, done);
    assert_eq!(server.ok(&cancel, json!({})).await, done);

    // Streamed as it runs: the events a later read gives again.
    let mut body = background(6);
    body["stream"] = json!(true);
    let response = server.post("/v1/responses").json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let live = sse_events(&response.text().await.unwrap());
    let last = &live.last().unwrap()["response"];
    assert_eq!(
        (&last["status"], items(last)),
        (&json!("incomplete"), items(&foreground))
    );
    let again = format!("/v1/responses/{}?stream=true", last["id"].as_str().unwrap());
    assert_eq!(streamed_again(&server, &again).await, live);
}

/// On a server of one sequence at a time, busy with a long answer, a background response
/// waits in the engine; cancelled, it leaves the engine's queue, ends cancelled (its
/// followers' streams with it), and is stored so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_background_response_and_is_kept() {
    let server = TestServer::with(Options {
        max_num_seqs: Some(1),
        generation_defaults: GenerationDefaults::Neutral,
        ..Default::default()
    })
    .await;
    let mut long = greedy("import sys", 1000);
    long["stream"] = json!(true);
    let mut running = server.post("/v1/completions").json(&long).send().await.unwrap();
    running.chunk().await.unwrap().expect("a first chunk");
    let queued = server.ok("/v1/responses", background(6)).await;
    let id = queued["id"].as_str().unwrap().to_string();
    server.wait_for_metric("peagle:num_requests_waiting", 1.0).await;
    // Its task takes it from queued to in progress as it starts.
    let start = Instant::now();
    while read(&server, &format!("/v1/responses/{id}")).await["status"] != "in_progress" {
        assert!(start.elapsed() < Duration::from_secs(10), "never in progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut on = request(2);
    on["previous_response_id"] = json!(id);
    let (status, error) = server.call("/v1/responses", on).await;
    assert_eq!(
        (status.as_u16(), &error["error"]["param"]),
        (400, &json!("previous_response_id"))
    );

    let follower = {
        let (client, url) = (server.client.clone(), server.url.clone());
        let path = format!("{url}/v1/responses/{id}?stream=true");
        tokio::spawn(async move { client.get(path).send().await.unwrap().text().await.unwrap() })
    };
    let cancelled = server.ok(&format!("/v1/responses/{id}/cancel"), json!({})).await;
    assert_eq!(
        (&cancelled["status"], &cancelled["output"]),
        (&json!("cancelled"), &json!([]))
    );
    assert_eq!(cancelled["usage"], Value::Null);
    server.wait_for_metric("peagle:num_requests_waiting", 0.0).await;
    let followed = tokio::time::timeout(Duration::from_secs(10), follower)
        .await
        .unwrap()
        .unwrap();
    let kinds: Vec<String> = sse_events(&followed).iter().map(|e| e["type"].to_string()).collect();
    assert_eq!(kinds, ["\"response.created\"", "\"response.in_progress\""]);
    assert_eq!(read(&server, &format!("/v1/responses/{id}")).await, cancelled);
    assert_eq!(
        server.ok(&format!("/v1/responses/{id}/cancel"), json!({})).await,
        cancelled
    );

    // Deleted while it waits: cancelled, then forgotten.
    let queued = server.ok("/v1/responses", background(6)).await;
    server.wait_for_metric("peagle:num_requests_waiting", 1.0).await;
    let path = format!("{}/v1/responses/{}", server.url, queued["id"].as_str().unwrap());
    let deleted = server.client.delete(&path).send().await.unwrap();
    assert_eq!(deleted.status(), 200);
    server.wait_for_metric("peagle:num_requests_waiting", 0.0).await;
    assert_eq!(server.client.get(&path).send().await.unwrap().status(), 404);
    drop(running);
}

/// A graceful stop waits for background responses as for requests on a connection. On a server
/// of one sequence, with a long background response running, a short one waiting and no
/// connection open, the stopping server still answers (its health 503, as it takes no new
/// work), a client follows the waiting one's events to its end once the long one is cancelled,
/// and the server stops after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_waits_for_background_responses() {
    let server = TestServer::with(Options {
        max_num_seqs: Some(1),
        config: ServerConfig {
            shutdown_timeout: Duration::from_secs(60),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let long = server.ok("/v1/responses", background(1000)).await;
    let short = server.ok("/v1/responses", background(6)).await;
    server.wait_for_metric("peagle:num_requests_waiting", 1.0).await;
    let (url, client) = (server.url.clone(), reqwest::Client::new());
    let id = |response: &Value| response["id"].as_str().unwrap().to_string();
    let stopped = tokio::spawn(server.shutdown());
    // A server that did not wait for them, with no connection open, would be gone by now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let health = client.get(format!("{url}/health")).send().await;
    assert_eq!(health.expect("stopped with background responses running").status(), 503);

    let follow = client.get(format!("{url}/v1/responses/{}?stream=true", id(&short)));
    let follower = tokio::spawn(async move { follow.send().await.unwrap().text().await.unwrap() });
    let cancel = format!("{url}/v1/responses/{}/cancel", id(&long));
    let cancelled: Value = client
        .post(cancel)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    let events = sse_events(&follower.await.unwrap());
    let last = &events.last().unwrap()["response"];
    assert_eq!(
        (&last["status"], &last["usage"]["output_tokens"]),
        (&json!("incomplete"), &json!(6))
    );
    stopped.await.unwrap().unwrap();
    assert!(
        client.get(format!("{url}/health")).send().await.is_err(),
        "still accepting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_background_responses_are_cancelled_and_only_stored_ones_run() {
    let server = TestServer::start().await;
    let foreground = server.ok("/v1/responses", request(2)).await;
    let cancel = format!("/v1/responses/{}/cancel", foreground["id"].as_str().unwrap());
    let (status, error) = server.call(&cancel, json!({})).await;
    assert_eq!(status.as_u16(), 400);
    assert_eq!(error["error"]["message"], "only background responses can be cancelled");
    let (status, _) = server.call("/v1/responses/resp_none/cancel", json!({})).await;
    assert_eq!(status.as_u16(), 404);

    let mut unstored = background(2);
    unstored["store"] = json!(false);
    let (status, error) = server.call("/v1/responses", unstored).await;
    assert_eq!((status.as_u16(), &error["error"]["param"]), (400, &json!("background")));
}

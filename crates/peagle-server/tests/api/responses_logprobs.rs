//! Output logprobs in the Responses API (`include: ["message.output_text.logprobs"]`): a
//! message's entries are its tokens' as chat gives them, streamed in its text deltas alike;
//! none without the `include`. Which tokens a message's are where the answer also reasons or
//! calls (harmony's channels, `<think>`, `<tool_call>`) is `routes/responses_logprobs.rs`'s
//! unit tests'.

use crate::common::TestServer;
use crate::responses::{as_chat, events, request};
use serde_json::{json, Value};

fn with_logprobs(mut body: Value, top: usize) -> Value {
    body["include"] = json!(["message.output_text.logprobs"]);
    body["top_logprobs"] = json!(top);
    body
}

/// The entries of the `response.output_text.delta` events, in order, and those of the
/// `response.output_text.done` events.
fn streamed_entries(events: &[Value]) -> (Vec<Value>, Vec<Value>) {
    let of = |kind: &str| -> Vec<Value> {
        let events = events.iter().filter(|e| e["type"] == kind);
        events.flat_map(|e| e["logprobs"].as_array().unwrap().clone()).collect()
    };
    (of("response.output_text.delta"), of("response.output_text.done"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_logprobs_are_its_tokens_as_chat_gives_them() {
    let server = TestServer::start().await;
    let body = with_logprobs(request(12), 3);
    let response = server.ok("/v1/responses", body.clone()).await;
    let mut chat = as_chat(12);
    chat["logprobs"] = json!(true);
    chat["top_logprobs"] = json!(3);
    let chat = server.ok("/v1/chat/completions", chat).await;
    let part = &response["output"][0]["content"][0];
    let entries = part["logprobs"].as_array().unwrap();
    assert_eq!((entries.len(), &response["top_logprobs"]), (12, &json!(3)));
    assert_eq!(part["logprobs"], chat["choices"][0]["logprobs"]["content"]);
    assert!(entries.iter().all(|e| e["top_logprobs"].as_array().unwrap().len() == 3));
    let tokens: String = entries.iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(part["text"], json!(tokens));

    let mut streaming = body;
    streaming["stream"] = json!(true);
    let events = events(&server, streaming).await;
    let (deltas, done) = streamed_entries(&events);
    assert_eq!((&deltas, &done), (entries, entries));
    assert_eq!(
        events.last().unwrap()["response"]["output"][0]["content"][0]["logprobs"],
        part["logprobs"]
    );

    // None asked for: no entries, and top_logprobs alone asks for none (as in vLLM).
    let mut plain = request(4);
    plain["top_logprobs"] = json!(2);
    let plain = server.ok("/v1/responses", plain).await;
    assert_eq!(plain["output"][0]["content"][0].get("logprobs"), None, "{plain}");
    assert_eq!(plain["top_logprobs"], 2, "echoed as asked, as OpenAI does");
    let mut out_of_bounds = request(4);
    out_of_bounds["top_logprobs"] = json!(21);
    let (status, error) = server.call("/v1/responses", out_of_bounds).await;
    assert_eq!(
        (status.as_u16(), &error["error"]["param"]),
        (400, &json!("top_logprobs"))
    );
}

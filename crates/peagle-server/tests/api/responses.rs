//! /v1/responses: the Responses API answers as the chat it reads its input as. The demo
//! model's text and usage equal the chat's, streamed events rebuild the response's items, a
//! JSON schema in `text.format` holds the text, and on the harmony model the reasoning,
//! function calls and their outputs in `input` render the prompt that chat messages do, and the
//! answer's reasoning, text and calls come back as items. Stored responses: `responses_store.rs`.

use crate::common::{TestServer, MODEL};
use crate::harmony::{harmony_gpt_oss, server, tool_turns, weather_tool, TOOL_POSITIONS};
use serde_json::{json, Value};

/// The chat test's conversation (a system message, then the user's) as a response request.
pub fn request(max_output_tokens: usize) -> Value {
    json!({
        "model": MODEL,
        "instructions": "You write Python.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Sort a list"}]}],
        "max_output_tokens": max_output_tokens,
        "temperature": 0,
        "ignore_eos": true,
    })
}

pub fn as_chat(max_tokens: usize) -> Value {
    json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": "Sort a list"},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
    })
}

/// Each output item's kind and text (a call's name and arguments), ids left out.
pub fn items(response: &Value) -> Vec<(String, String)> {
    let items = response["output"].as_array().unwrap();
    items
        .iter()
        .map(|item| {
            let kind = item["type"].as_str().unwrap().to_string();
            let text = match kind.as_str() {
                "function_call" => format!("{}({})", item["name"], item["arguments"].as_str().unwrap()),
                _ => item["content"][0]["text"].as_str().unwrap().to_string(),
            };
            (kind, text)
        })
        .collect()
}

/// A stream's events, checking the framing (`sse_events`).
pub async fn events(server: &TestServer, body: Value) -> Vec<Value> {
    let response = server.post("/v1/responses").json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let events = sse_events(&response.text().await.unwrap());
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], i, "{event}");
    }
    events
}

/// A Responses stream's events, checking the framing: each `event:` names its data's type,
/// and no `[DONE]` follows (the Responses API sends none).
pub fn sse_events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(name.strip_prefix("event: "), data["type"].as_str(), "{e}");
            data
        })
        .collect()
}

/// The items a client rebuilds from the deltas, each checked against its done event.
pub fn rebuilt(events: &[Value]) -> Vec<(String, String)> {
    let mut built: Vec<(String, String)> = Vec::new();
    for event in events {
        let delta = event["delta"].as_str().unwrap_or("");
        match event["type"].as_str().unwrap() {
            "response.output_item.added" => {
                let item = &event["item"];
                let text = match item["type"].as_str().unwrap() {
                    "function_call" => format!("{}(", item["name"]),
                    _ => String::new(),
                };
                built.push((item["type"].as_str().unwrap().to_string(), text));
            }
            "response.output_text.delta" | "response.reasoning_text.delta" => {
                built.last_mut().unwrap().1 += delta;
            }
            "response.function_call_arguments.delta" => built.last_mut().unwrap().1 += delta,
            "response.output_item.done" => {
                let last = built.last_mut().unwrap();
                if last.0 == "function_call" {
                    last.1 += ")";
                }
                let done = items(&json!({"output": [event["item"]]}));
                assert_eq!(done[0], *last, "{event}");
            }
            _ => {}
        }
    }
    built
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_as_the_chat_it_reads_and_streams_the_same_items() {
    let server = TestServer::start().await;
    let body = server.ok("/v1/responses", request(10)).await;
    let chat = server.ok("/v1/chat/completions", as_chat(10)).await;
    assert!(body["id"].as_str().unwrap().starts_with("resp_"), "{body}");
    assert_eq!((&body["object"], &body["model"]), (&json!("response"), &json!(MODEL)));
    let content = chat["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(items(&body), [("message".to_string(), content.to_string())]);
    let message = &body["output"][0];
    assert_eq!(
        (&message["role"], &message["status"]),
        (&json!("assistant"), &json!("incomplete"))
    );
    assert!(message["id"].as_str().unwrap().starts_with("msg_"), "{message}");
    assert_eq!(body["status"], "incomplete");
    assert_eq!(body["incomplete_details"], json!({"reason": "max_output_tokens"}));
    let usage = &body["usage"];
    assert_eq!(usage["input_tokens"], chat["usage"]["prompt_tokens"]);
    assert_eq!(usage["output_tokens"], 10);
    assert_eq!(usage["total_tokens"], chat["usage"]["total_tokens"]);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(
        (
            &body["instructions"],
            &body["store"],
            &body["tool_choice"],
            &body["tools"]
        ),
        (&json!("You write Python."), &json!(true), &json!("auto"), &json!([]))
    );

    let mut streaming = request(10);
    streaming["stream"] = json!(true);
    let events = events(&server, streaming).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..2], ["response.created", "response.in_progress"]);
    assert_eq!(events[0]["response"]["status"], "in_progress");
    assert_eq!(kinds.last(), Some(&"response.incomplete"));
    assert_eq!(rebuilt(&events), items(&body));
    let last = &events.last().unwrap()["response"];
    assert_eq!(items(last), items(&body));
    for count in ["input_tokens", "output_tokens", "total_tokens"] {
        assert_eq!(last["usage"][count], body["usage"][count], "{count}");
    }

    // A string input is the user's message; reasoning.encrypted_content is accepted (none is
    // written).
    let plain = json!({"input": "Sort a list", "max_output_tokens": 5, "temperature": 0, "ignore_eos": true,
                       "include": ["reasoning.encrypted_content"]});
    let body = server.ok("/v1/responses", plain).await;
    let mut chat = as_chat(5);
    chat["messages"].as_array_mut().unwrap().remove(0);
    let chat = server.ok("/v1/chat/completions", chat).await;
    let content = chat["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(items(&body), [("message".to_string(), content.to_string())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_format_holds_the_answer_to_a_json_schema() {
    let server = TestServer::start().await;
    let schema = json!({"enum": ["ascending", "descending", 1]});
    let mut body = request(80);
    body["ignore_eos"] = json!(false);
    body["text"] = json!({"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true}});
    let response = server.ok("/v1/responses", body.clone()).await;
    assert_eq!(response["status"], "completed", "{response}");
    assert!(response["completed_at"].as_u64().is_some(), "{response}");
    assert_eq!(response["text"], body["text"]);
    let text = response["output"][0]["content"][0]["text"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(schema["enum"].as_array().unwrap().contains(&value), "{value}");
    let mut chat = as_chat(80);
    chat["ignore_eos"] = json!(false);
    chat["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}});
    let chat = server.ok("/v1/chat/completions", chat).await;
    assert_eq!(chat["choices"][0]["message"]["content"], text);

    body["response_format"] = json!({"type": "json_object"});
    let (status, error) = server.call("/v1/responses", body).await;
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["error"]["param"], "response_format", "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_not_served_is_refused_by_its_field() {
    let server = TestServer::start().await;
    let with = |field: &str, value: Value| {
        let mut body = request(4);
        body[field] = value;
        body
    };
    let refused = [
        (with("previous_response_id", json!("resp_1")), "previous_response_id"),
        (with("conversation", json!("conv_1")), "conversation"),
        (
            {
                let mut body = with("background", json!(true));
                body["store"] = json!(false);
                body
            },
            "background",
        ),
        (
            with(
                "include",
                json!(["message.output_text.logprobs", "file_search_call.results"]),
            ),
            "include",
        ),
        (with("prompt_logprobs", json!(1)), "prompt_logprobs"),
        (with("top_logprobs", json!(-1)), "top_logprobs"),
        (with("truncation", json!("auto")), "truncation"),
        (with("n", json!(2)), "n"),
        (with("max_output_tokens", json!(0)), "max_output_tokens"),
        (with("input", json!([])), "input"),
        (
            with("input", json!([{"role": "robot", "content": "hi"}])),
            "input[0].role",
        ),
        (with("input", json!([{"content": "hi"}])), "input[0].type"),
        (
            with("input", json!([{"type": "item_reference", "id": "x"}])),
            "input[0].type",
        ),
        (
            with(
                "input",
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
            ),
            "input[0].content[0]",
        ),
        (
            with(
                "input",
                json!([{"type": "function_call", "name": "f", "arguments": "{}"}]),
            ),
            "input[0].call_id",
        ),
        (
            with("input", json!([{"type": "function_call_output", "call_id": "c"}])),
            "input[0].call_id",
        ),
        (
            with(
                "input",
                json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]),
            ),
            "input[0].arguments",
        ),
        (
            with(
                "input",
                json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                       {"type": "function_call_output", "call_id": "c"}]),
            ),
            "input[1].output",
        ),
        (
            with(
                "input",
                json!([{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]}]),
            ),
            "input",
        ),
        (with("tools", json!([{"type": "web_search"}])), "tools[0].type"),
        (
            with("tools", json!([{"type": "function", "name": "a b"}])),
            "tools[0].name",
        ),
        (with("tool_choice", json!({"type": "web_search"})), "tool_choice"),
        (with("reasoning", json!({"effort": "minimal"})), "reasoning.effort"),
        (
            with("text", json!({"format": {"type": "json_schema", "name": "x"}})),
            "text.format.schema",
        ),
        (with("text", json!({"format": {"type": "xml"}})), "text.format.type"),
        (with("model", json!("other")), "model"),
        (with("metadata", json!(["a"])), "metadata"),
        (with("metadata", json!({"a": 1})), "metadata"),
        (with("metadata", json!({"a": "x".repeat(513)})), "metadata"),
    ];
    for (body, param) in refused {
        let (status, error) = server.call("/v1/responses", body).await;
        let want = match param {
            "model" | "previous_response_id" => 404,
            _ => 400,
        };
        assert_eq!(status, want, "{param}: {error}");
        assert_eq!(error["error"]["param"], param, "{error}");
    }
}

/// The chat test's turns (a call, its result) as Responses items, with the reasoning before
/// the call.
fn tool_items() -> Value {
    json!([
        {"role": "user", "content": "def weather"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "call it"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "cold"},
    ])
}

fn flat_weather_tool() -> Value {
    let tool = weather_tool();
    let mut flat = tool["function"].clone();
    flat["type"] = json!("function");
    flat
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harmony_calls_and_reasoning_round_trip_as_items() {
    let model = harmony_gpt_oss(TOOL_POSITIONS);
    let server = server(model.path(), false).await;
    let body = json!({"input": tool_items(), "tools": [flat_weather_tool()], "temperature": 0,
                      "max_output_tokens": 30, "reasoning": {"effort": "high"}});
    let response = server.ok("/v1/responses", body.clone()).await;
    let chat = json!({"messages": tool_turns(), "tools": [weather_tool()], "temperature": 0, "max_tokens": 30,
                      "reasoning_effort": "high"});
    let chat = server.ok("/v1/chat/completions", chat).await;
    assert_eq!(
        response["usage"]["input_tokens"], chat["usage"]["prompt_tokens"],
        "{response}"
    );
    assert_eq!(response["usage"]["output_tokens"], chat["usage"]["completion_tokens"]);
    let message = &chat["choices"][0]["message"];
    let mut want = Vec::new();
    for (kind, field) in [("reasoning", "reasoning_content"), ("message", "content")] {
        if let Some(text) = message[field].as_str().filter(|t| !t.is_empty()) {
            want.push((kind.to_string(), text.to_string()));
        }
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        let function = &call["function"];
        let text = format!("{}({})", function["name"], function["arguments"].as_str().unwrap());
        want.push(("function_call".to_string(), text));
    }
    assert_eq!(items(&response), want, "{response} {chat}");
    let reasoning_tokens = response["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        reasoning_tokens > 0,
        message["reasoning_content"].is_string(),
        "{response}"
    );
    assert!(reasoning_tokens <= response["usage"]["output_tokens"].as_u64().unwrap());

    // Streamed: the items the events build hold the same texts, kind by kind.
    let mut streaming = body;
    streaming["stream"] = json!(true);
    let events = events(&server, streaming).await;
    let joined = |items: &[(String, String)], kind: &str| -> String {
        items
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, t)| t.as_str())
            .collect()
    };
    let streamed = rebuilt(&events);
    for kind in ["reasoning", "message", "function_call"] {
        assert_eq!(joined(&streamed, kind), joined(&want, kind), "{kind}");
    }
}

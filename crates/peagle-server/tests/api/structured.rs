//! Structured output over HTTP: each way of asking (response_format, guided_*,
//! structured_outputs) constrains the demo model's greedy text, alike with and without
//! speculation, streamed or not; what cannot be compiled is a 400 naming the field.

use crate::common::{greedy, streamed, texts, TestServer, MODEL};
use peagle_grammar::{Spec, Vocabulary};
use serde_json::{json, Value};

/// A greedy completion of `prompt` under `field: value`, allowed to end (end-of-sequence
/// counts once the text is whole).
fn constrained(prompt: &str, field: &str, value: Value) -> Value {
    let mut request = greedy(prompt, 120);
    request["ignore_eos"] = json!(false);
    request[field] = value;
    request
}

/// The text of the one choice, after checking that it is the same without speculation.
async fn text_alike_without_speculation(server: &TestServer, path: &str, request: Value) -> (String, Value) {
    let body = server.ok(path, request.clone()).await;
    let mut plain = request;
    plain["speculative"] = json!(false);
    let plain_body = server.ok(path, plain).await;
    let text = |b: &Value| match path {
        "/v1/completions" => texts(b)[0].clone(),
        _ => b["choices"][0]["message"]["content"].as_str().unwrap().to_string(),
    };
    assert_eq!(text(&body), text(&plain_body), "speculation changed the text");
    (text(&body), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_schema_shapes_the_text_alike_with_and_without_speculation() {
    let server = TestServer::start().await;
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "args": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3},
            "pure": {"type": "boolean"}
        },
        "required": ["name", "args", "pure"]
    });
    let request = constrained("def make_config():\n    return ", "guided_json", schema.clone());
    let (text, body) = text_alike_without_speculation(&server, "/v1/completions", request.clone()).await;
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(
        value["name"].as_str().is_some_and(|n| n.chars().count() <= 12),
        "{value}"
    );
    assert!(
        value["args"]
            .as_array()
            .is_some_and(|a| a.len() <= 3 && a.iter().all(|n| n.as_i64().is_some_and(|n| (0..=99).contains(&n)))),
        "{value}"
    );
    assert!(value["pure"].is_boolean(), "{value}");

    // The same schema as OpenAI's response_format, streamed: the same text.
    let mut streaming = request;
    streaming.as_object_mut().unwrap().remove("guided_json");
    streaming["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": "config", "schema": schema, "strict": true}});
    streaming["stream"] = json!(true);
    let (streamed_text, finish) = streamed(&server.stream("/v1/completions", streaming).await, 0, "text");
    assert_eq!((streamed_text, finish.as_deref()), (text, Some("stop")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choices_regexes_and_json_objects_constrain_completions_and_chat() {
    let server = TestServer::start().await;
    let choices = ["True", "False", "None"];
    let request = constrained("x = 1 if y else", "guided_choice", json!(choices));
    let (text, _) = text_alike_without_speculation(&server, "/v1/completions", request).await;
    assert!(choices.contains(&text.as_str()), "{text:?}");

    let request = constrained("VERSION = ", "guided_regex", json!(r#""[0-9]+\.[0-9]+""#));
    let (text, _) = text_alike_without_speculation(&server, "/v1/completions", request).await;
    let version = regex_lite_match(&text);
    assert!(version, "{text:?}");

    let grammar = "root ::= flag \" # \" word\nflag ::= \"True\" | \"False\"\nword ::= [a-z]{1,8}";
    let request = constrained("x = ", "guided_grammar", json!(grammar));
    let (text, _) = text_alike_without_speculation(&server, "/v1/completions", request).await;
    let (flag, word) = text.split_once(" # ").unwrap_or_else(|| panic!("{text:?}"));
    assert!(
        ["True", "False"].contains(&flag) && (1..=8).contains(&word.len()),
        "{text:?}"
    );
    assert!(word.bytes().all(|b| b.is_ascii_lowercase()), "{text:?}");

    let chat = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Describe the os module as JSON."}],
        "temperature": 0,
        "max_tokens": 160,
        "response_format": {"type": "json_object"},
    });
    let (content, body) = text_alike_without_speculation(&server, "/v1/chat/completions", chat.clone()).await;
    let finish = body["choices"][0]["finish_reason"].as_str().unwrap();
    // The demo model nests objects until the budget ends; whole or cut, the text is JSON's.
    let object = Spec::JsonObject { whitespace: None }
        .compile(&Vocabulary::new(Vec::new()))
        .unwrap();
    let state = object.advance_bytes(&object.start(), content.as_bytes());
    match finish {
        "stop" => assert!(serde_json::from_str::<Value>(&content)
            .unwrap_or_else(|e| panic!("{e}: {content:?}"))
            .is_object()),
        _ => assert!(!state.is_dead() && content.starts_with('{'), "{content:?}"),
    }
    let mut vllm = chat;
    vllm.as_object_mut().unwrap().remove("response_format");
    vllm["structured_outputs"] = json!({"json_object": true});
    let (again, _) = text_alike_without_speculation(&server, "/v1/chat/completions", vllm).await;
    assert_eq!(again, content, "structured_outputs asks as response_format does");
}

/// Structural tags: exactly one call that a trigger starts and its schema holds, and formats
/// composed, as `response_format` and as vLLM's `structured_outputs.structural_tag` (its
/// JSON text), alike with and without speculation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structural_tags_shape_calls_and_composed_text() {
    let server = TestServer::start().await;
    let call = json!({"type": "tag", "begin": "<call=get_weather>", "end": "</call>",
        "content": {"type": "json_schema", "json_schema": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}},
                    "required": ["city"], "additionalProperties": false}}});
    let one_call = json!({"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<call="],
        "tags": [call], "at_least_one": true, "stop_after_first": true}});
    let request = constrained("def weather():\n    ", "response_format", one_call.clone());
    let (text, body) = text_alike_without_speculation(&server, "/v1/completions", request.clone()).await;
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    let arguments = text
        .strip_prefix("<call=get_weather>")
        .and_then(|t| t.strip_suffix("</call>"))
        .unwrap_or_else(|| panic!("{text:?}"));
    let arguments: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(
        ["Oslo", "Rome"].contains(&arguments["city"].as_str().unwrap()),
        "{text:?}"
    );

    let mut vllm = request;
    vllm.as_object_mut().unwrap().remove("response_format");
    vllm["structured_outputs"] = json!({"structural_tag": one_call.to_string()});
    vllm["stream"] = json!(true);
    let (streamed_text, finish) = streamed(&server.stream("/v1/completions", vllm).await, 0, "text");
    assert_eq!((streamed_text, finish.as_deref()), (text, Some("stop")));

    let import = json!({"format": {"type": "sequence", "elements": [
        {"type": "const_string", "value": "import "},
        {"type": "or", "elements": [{"type": "const_string", "value": "os"}, {"type": "const_string", "value": "sys"}]},
        {"type": "repeat", "min": 1, "max": 2, "content": {"type": "regex", "pattern": ", [a-z]{1,6}"}}]}});
    let request = constrained(
        "# imports\n",
        "structured_outputs",
        json!({"structural_tag": import.to_string()}),
    );
    let (text, body) = text_alike_without_speculation(&server, "/v1/completions", request).await;
    assert_eq!(body["choices"][0]["finish_reason"], "stop", "{body}");
    let rest = text
        .strip_prefix("import os, ")
        .or_else(|| text.strip_prefix("import sys, "))
        .unwrap_or_else(|| panic!("{text:?}"));
    let names: Vec<&str> = rest.split(", ").collect();
    assert!(
        names.len() <= 2
            && names
                .iter()
                .all(|n| (1..=6).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_lowercase())),
        "{text:?}"
    );
}

/// Whether `text` is a double-quoted `digits.digits`.
fn regex_lite_match(text: &str) -> bool {
    let Some(inner) = text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return false;
    };
    let Some((major, minor)) = inner.split_once('.') else {
        return false;
    };
    [major, minor]
        .iter()
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_compiled_is_a_400_naming_the_field() {
    let server = TestServer::start().await;
    let cases = [
        ("guided_json", json!({"type": "integer", "multipleOf": 5}), "multipleOf"),
        ("guided_json", json!({"$ref": "#/$defs/missing"}), "names nothing"),
        ("guided_regex", json!("a("), "invalid regex"),
        ("guided_grammar", json!("root ::= item"), "never defined"),
        ("guided_grammar", json!("root ::= root \"a\" | \"b\""), "left-recursive"),
        ("guided_regex", json!(r"\bword"), "not supported"),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}),
            "unknown type",
        ),
        (
            "response_format",
            json!({"type": "structural_tag", "format": {"type": "exclude_token"}}),
            "format: exclude_token is not supported",
        ),
        (
            "response_format",
            json!({"type": "structural_tag", "structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}], "triggers": ["<g"]}),
            "no trigger begins the tag \"<f>\"",
        ),
        (
            "structured_outputs",
            json!({"structural_tag": r#"{"format": {"type": "token", "token": "<|im_start|>"}}"#}),
            "format.token: \"<|im_start|>\" names no special token of this model",
        ),
    ];
    for (field, value, says) in cases {
        let (status, body) = server
            .call("/v1/completions", constrained("x", field, value.clone()))
            .await;
        assert_eq!(status, 400, "{field}: {value}: {body}");
        assert_eq!(body["error"]["param"], field, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    }
}

fn weather_chat(tool_choice: Value) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "temperature": 0,
        "max_tokens": 120,
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer"}},
                "required": ["city"]
            }}},
            {"type": "function", "function": {"name": "get_time"}}
        ],
        "tool_choice": tool_choice,
    })
}

/// The calls of a chat answer, (name, arguments), after checking that it has no content and
/// finished with "stop" (a forced call's finish, as in vLLM and OpenAI).
fn forced_calls(body: &Value) -> Vec<(String, String)> {
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{body}");
    assert!(choice["message"]["content"].is_null(), "{body}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    calls
        .iter()
        .map(|c| {
            assert!(c["id"].as_str().unwrap().starts_with("call_"), "{c}");
            let f = &c["function"];
            (
                f["name"].as_str().unwrap().to_string(),
                f["arguments"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A named tool_choice makes the answer that function's arguments, following its schema,
/// without a tool call parser (the demo server has none); alike with and without speculation,
/// and streamed as one call's pieces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_tool_choice_makes_the_answer_its_call() {
    let server = TestServer::start().await;
    let request = weather_chat(json!({"type": "function", "function": {"name": "get_weather"}}));
    let body = server.ok("/v1/chat/completions", request.clone()).await;
    let calls = forced_calls(&body);
    assert_eq!(calls.len(), 1, "{body}");
    assert_eq!(calls[0].0, "get_weather");
    let arguments: Value = serde_json::from_str(&calls[0].1).unwrap_or_else(|e| panic!("{e}: {}", calls[0].1));
    assert!(
        arguments["city"].as_str().is_some_and(|c| c.chars().count() <= 10),
        "{arguments}"
    );

    let mut plain = request.clone();
    plain["speculative"] = json!(false);
    assert_eq!(forced_calls(&server.ok("/v1/chat/completions", plain).await), calls);

    let mut streaming = request;
    streaming["stream"] = json!(true);
    let chunks = server.stream("/v1/chat/completions", streaming).await;
    let deltas: Vec<&Value> = chunks
        .iter()
        .flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert_eq!(deltas[0]["function"]["name"], "get_weather", "{deltas:?}");
    assert!(deltas.iter().all(|d| d["index"] == 0));
    let arguments: String = deltas
        .iter()
        .map(|d| d["function"]["arguments"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(arguments, calls[0].1);
}

/// "required" makes the answer calls of the offered functions; with parallel calls off, one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_tool_choice_makes_the_answer_calls_of_offered_tools() {
    let server = TestServer::start().await;
    let mut request = weather_chat(json!("required"));
    request["parallel_tool_calls"] = json!(false);
    let body = server.ok("/v1/chat/completions", request.clone()).await;
    let calls = forced_calls(&body);
    assert_eq!(calls.len(), 1, "{body}");
    let (name, arguments) = &calls[0];
    let arguments: Value = serde_json::from_str(arguments).unwrap();
    match name.as_str() {
        "get_weather" => assert!(arguments["city"].is_string(), "{arguments}"),
        "get_time" => assert!(arguments.is_object(), "{arguments}"),
        other => panic!("a call of {other}, which was not offered"),
    }
    request["speculative"] = json!(false);
    assert_eq!(forced_calls(&server.ok("/v1/chat/completions", request).await), calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_calls_that_cannot_be_honoured_are_a_400() {
    let server = TestServer::start().await;
    let chat = "/v1/chat/completions";
    let unknown = weather_chat(json!({"type": "function", "function": {"name": "get_news"}}));
    let mut no_tools = weather_chat(json!("required"));
    no_tools["tools"] = json!([]);
    let mut both = weather_chat(json!("required"));
    both["response_format"] = json!({"type": "json_object"});
    let mut unsupported = weather_chat(json!("required"));
    unsupported["tools"][0]["function"]["parameters"]["properties"]["days"]["multipleOf"] = json!(7);
    let mut completion = greedy("x", 4);
    completion["tool_choice"] = json!("required");
    for (path, body, param) in [
        (chat, unknown, "tool_choice"),
        (chat, no_tools, "tool_choice"),
        (chat, both, "response_format"),
        (chat, unsupported, "tools"),
        ("/v1/completions", completion, "tool_choice"),
    ] {
        let (status, error) = server.call(path, body.clone()).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["param"], param, "{error}");
    }
}

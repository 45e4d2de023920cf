//! gpt-oss's tools over HTTP: offered tools and past calls rendered as harmony, requests for
//! tools that cannot be honoured refused, forced calls held to their functions' parameters, and
//! structural tags that name harmony's tokens.

use crate::harmony::{
    harmony_gpt_oss, messages, prompt_text, server, tool_turns, weather_tool, MARKERS, TOOL_POSITIONS,
};
use peagle_grammar::{Constraint, Spec, Vocabulary};
use peagle_server::harmony::{self, ReasoningEffort};
use peagle_server::protocol::chat::ChatMessage;
use peagle_server::protocol::tools::{offered_tools, Tool, ToolChoice};
use serde_json::{json, Value};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_offered_and_past_calls_rendered() {
    let model = harmony_gpt_oss(TOOL_POSITIONS);
    let server = server(model.path(), false).await;
    let tools = json!([weather_tool()]);
    let text = prompt_text(&server, json!({"messages": tool_turns(), "tools": tools})).await;
    let parsed: Vec<ChatMessage> = serde_json::from_value(tool_turns()).unwrap();
    let tools_parsed: Vec<Tool> = serde_json::from_value(tools.clone()).unwrap();
    let offered = offered_tools(Some(&tools_parsed), &ToolChoice::Auto).unwrap();
    let want = harmony::render(&parsed, ReasoningEffort::Medium, &harmony::today(), &offered).unwrap();
    assert_eq!(text, want);
    let call =
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Oslo\"}<|call|>";
    let result = "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>cold<|end|>";
    for part in [
        "Calls to these tools must go to the commentary channel: 'functions'.",
        "// Weather for a city.\ntype get_weather = (_: {\ncity: string,\n}) => any;",
        "<|channel|>analysis<|message|>call it<|end|>",
        call,
        result,
    ] {
        assert!(text.contains(part), "{part} not in {text}");
    }
    // tool_choice "none" offers no tools; the past call and its result stay.
    let none = json!({"messages": tool_turns(), "tools": tools, "tool_choice": "none"});
    let text = prompt_text(&server, none).await;
    assert!(
        !text.contains("namespace functions") && !text.contains("Calls to these tools"),
        "{text}"
    );
    assert!(text.contains(call) && text.contains(result), "{text}");

    // Answered streamed or not alike, whatever the random model makes of it: every call
    // named, and a turn that called a tool finishing for "tool_calls".
    let request = json!({"messages": tool_turns(), "tools": tools, "temperature": 0, "max_tokens": 30});
    let body = server.ok("/v1/chat/completions", request.clone()).await;
    let choice = &body["choices"][0];
    let calls = choice["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
    let finish = choice["finish_reason"].as_str().unwrap();
    assert!(["stop", "length", "tool_calls"].contains(&finish), "{body}");
    assert_eq!(
        finish == "tool_calls",
        !calls.is_empty() && choice["stop_reason"] == 383,
        "{body}"
    );
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (mut content, mut s_calls) = (String::new(), Vec::<Value>::new());
    let mut s_finish = String::new();
    for chunk in server.stream("/v1/chat/completions", streamed).await {
        let choice = &chunk["choices"][0];
        content += choice["delta"]["content"].as_str().unwrap_or("");
        for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            match call["index"].as_u64().unwrap() as usize {
                i if i == s_calls.len() => s_calls.push(call["function"].clone()),
                i => {
                    let more = call["function"]["arguments"].as_str().unwrap();
                    let joined = s_calls[i]["arguments"].as_str().unwrap().to_string() + more;
                    s_calls[i]["arguments"] = json!(joined);
                }
            }
        }
        s_finish += choice["finish_reason"].as_str().unwrap_or("");
    }
    assert_eq!(content, choice["message"]["content"].as_str().unwrap_or(""));
    let functions: Vec<Value> = calls.iter().map(|c| c["function"].clone()).collect();
    assert_eq!((s_calls, s_finish.as_str()), (functions, finish));

    // tool_choice "none": answered with no tool offered, so with no call.
    let mut none = request.clone();
    none["tool_choice"] = json!("none");
    let body = server.ok("/v1/chat/completions", none).await;
    assert!(body["choices"][0]["message"].get("tool_calls").is_none(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_requests_that_cannot_be_honoured_are_refused() {
    let model = harmony_gpt_oss(TOOL_POSITIONS);
    let server = server(model.path(), false).await;
    let chat = "/v1/chat/completions";
    let request = |tools: Value, choice: Value, messages: Value| json!({"messages": messages, "tools": tools, "tool_choice": choice, "max_tokens": 4});
    let mut unanswered = tool_turns();
    unanswered[2]["tool_call_id"] = json!("call_2");
    let mut misnamed = tool_turns();
    misnamed[1]["tool_calls"][0]["function"]["name"] = json!("get_weather<|end|>");
    let mut forced_and_formatted = request(json!([weather_tool()]), json!("required"), tool_turns());
    forced_and_formatted["response_format"] = json!({"type": "json_object"});
    for (body, param) in [
        (forced_and_formatted, "response_format"),
        (
            request(json!([{"type": "web_search"}]), Value::Null, tool_turns()),
            "tools[0]",
        ),
        (
            request(
                json!([{"type": "web_search", "function": {"name": "f"}}]),
                Value::Null,
                tool_turns(),
            ),
            "tools[0].type",
        ),
        (
            request(
                json!([{"type": "function", "function": {"name": "get weather"}}]),
                Value::Null,
                tool_turns(),
            ),
            "tools[0].function.name",
        ),
        (
            request(json!([weather_tool()]), Value::Null, unanswered),
            "messages[2].tool_call_id",
        ),
        (
            request(json!([weather_tool()]), Value::Null, misnamed),
            "messages[1].tool_calls[0].function.name",
        ),
    ] {
        let (status, error) = server.call(chat, body).await;
        assert_eq!(status, 400, "{error}");
        assert_eq!(error["error"]["param"], param, "{error}");
    }
}

/// Two tools whose arguments are finite (the random model's strings would not end).
fn bounded_tools() -> Value {
    let enumerated = |name: &str, property: &str, values: Value| {
        json!({"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {property: {"enum": values}},
            "required": [property], "additionalProperties": false}}})
    };
    json!([
        enumerated("get_weather", "city", json!(["Oslo", "Rome"])),
        enumerated("get_time", "zone", json!(["CET", "UTC"])),
    ])
}

/// A forced call (a named function, or "required") holds a harmony answer to reasoning, then
/// one call of a forced function with arguments its parameters accept: the random model,
/// which calls nothing when free to, calls; streamed alike, and in the Responses API as a
/// `function_call` item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_calls_follow_the_functions_parameters() {
    let model = harmony_gpt_oss(TOOL_POSITIONS);
    let server = server(model.path(), true).await;
    let request = |choice: Value| {
        json!({"messages": messages(), "tools": bounded_tools(), "tool_choice": choice,
               "temperature": 0, "max_tokens": 200})
    };
    let free = server.ok("/v1/chat/completions", request(json!("auto"))).await;
    assert!(free["choices"][0]["message"].get("tool_calls").is_none(), "{free}");

    let arguments = |name: &str| match name {
        "get_weather" => ["{\"city\":\"Oslo\"}", "{\"city\":\"Rome\"}"],
        "get_time" => ["{\"zone\":\"CET\"}", "{\"zone\":\"UTC\"}"],
        other => panic!("{other} was not offered"),
    };
    let named = json!({"type": "function", "function": {"name": "get_time"}});
    for (choice, names) in [
        (named, vec!["get_time"]),
        (json!("required"), vec!["get_weather", "get_time"]),
    ] {
        let body = server.ok("/v1/chat/completions", request(choice.clone())).await;
        let answer = &body["choices"][0];
        assert_eq!(answer["finish_reason"], "tool_calls", "{body}");
        let calls = answer["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{body}");
        let name = calls[0]["function"]["name"].as_str().unwrap();
        assert!(names.contains(&name), "{body}");
        let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
        let allowed: Vec<Value> = arguments(name)
            .iter()
            .map(|a| serde_json::from_str(a).unwrap())
            .collect();
        assert!(allowed.contains(&args), "{body}");

        let mut streamed = request(choice);
        streamed["stream"] = json!(true);
        let (mut s_name, mut s_args, mut finish) = (String::new(), String::new(), String::new());
        for chunk in server.stream("/v1/chat/completions", streamed).await {
            let choice = &chunk["choices"][0];
            for call in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(call["index"], 0, "{chunk}");
                s_name += call["function"]["name"].as_str().unwrap_or("");
                s_args += call["function"]["arguments"].as_str().unwrap_or("");
            }
            finish += choice["finish_reason"].as_str().unwrap_or("");
        }
        assert_eq!(
            (s_name.as_str(), s_args.as_str(), finish.as_str()),
            (name, calls[0]["function"]["arguments"].as_str().unwrap(), "tool_calls")
        );
    }

    let response = server
        .ok(
            "/v1/responses",
            json!({"input": "def count", "temperature": 0, "max_output_tokens": 200,
                   "tools": [{"type": "function", "name": "get_time", "parameters": bounded_tools()[1]["function"]["parameters"]}],
                   "tool_choice": {"type": "function", "name": "get_time"}}),
        )
        .await;
    let calls: Vec<&Value> = response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{response}");
    assert_eq!(calls[0]["name"], "get_time", "{response}");
    let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        args == json!({"zone": "CET"}) || args == json!({"zone": "UTC"}),
        "{response}"
    );
}

/// A structural tag on gpt-oss's raw completions: strings that name harmony's tokens mean the
/// tokens, so an analysis message and then a final one are held to harmony's syntax, each
/// marker one special token, alike with and without speculation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structural_tags_name_harmony_tokens() {
    let model = harmony_gpt_oss(256);
    let server = server(model.path(), true).await;
    let tag = json!({"type": "structural_tag", "format": {"type": "sequence", "elements": [
        {"type": "tag", "begin": "<|channel|>analysis<|message|>", "content": {"type": "regex", "pattern": "[a-z]{1,5}"}, "end": "<|end|>"},
        {"type": "const_string", "value": "<|start|>assistant<|channel|>final<|message|>"},
        {"type": "json_schema", "json_schema": {"enum": ["yes", "no"]}}]}});
    let request = json!({"prompt": "def count", "temperature": 0, "max_tokens": 60, "response_format": tag,
                         "skip_special_tokens": false, "logprobs": 0, "return_tokens_as_token_ids": true});
    let body = server.ok("/v1/completions", request.clone()).await;
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{body}");
    let text = choice["text"].as_str().unwrap();
    let (analysis, final_answer) = text
        .strip_prefix("<|channel|>analysis<|message|>")
        .and_then(|t| t.split_once("<|end|><|start|>assistant<|channel|>final<|message|>"))
        .unwrap_or_else(|| panic!("{text:?}"));
    assert!(
        (1..=5).contains(&analysis.len()) && analysis.bytes().all(|b| b.is_ascii_lowercase()),
        "{text:?}"
    );
    assert!(["\"yes\"", "\"no\""].contains(&final_answer), "{text:?}");
    let tokens: Vec<&str> = choice["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let marker = |name: &str| format!("token_id:{}", 377 + MARKERS.iter().position(|m| *m == name).unwrap());
    let (channel, message, end, start) = (
        marker("<|channel|>"),
        marker("<|message|>"),
        marker("<|end|>"),
        marker("<|start|>"),
    );
    assert_eq!(tokens[..1], [channel.as_str()], "{tokens:?}");
    let count = |m: &str| tokens.iter().filter(|t| **t == m).count();
    assert_eq!(
        (count(&channel), count(&message), count(&end), count(&start)),
        (2, 2, 1, 1),
        "{tokens:?}"
    );

    let mut plain = request;
    plain["speculative"] = json!(false);
    let plain_body = server.ok("/v1/completions", plain).await;
    assert_eq!(plain_body["choices"][0]["text"], choice["text"]);

    // vLLM's tag for gpt-oss's reasoning: free text, harmony's other markers in it, where the
    // analysis channel's trigger holds a message to its syntax. Whatever the random model
    // writes follows it (here `<|start|>` among text).
    let reasoning = json!({"type": "structural_tag", "format": {"type": "triggered_tags",
        "triggers": ["<|channel|>analysis"],
        "tags": [{"begin": "<|channel|>analysis<|message|>", "content": {"type": "any_text"}, "end": "<|end|>"}]}});
    let request = json!({"prompt": "def count", "temperature": 0, "max_tokens": 40, "response_format": reasoning.clone(),
                         "logprobs": 0, "return_tokens_as_token_ids": true});
    let body = server.ok("/v1/completions", request).await;
    let ids: Vec<u32> = body["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().strip_prefix("token_id:").unwrap().parse().unwrap())
        .collect();
    let tokenizer = tokenizers::Tokenizer::from_file(model.path().join("tokenizer.json")).unwrap();
    let vocab = Arc::new(Vocabulary::from_tokenizer(&tokenizer).unwrap());
    let constraint = Constraint::new(Spec::StructuralTag(reasoning).compile(&vocab).unwrap(), vocab);
    let state = ids.iter().fold(constraint.start(), |s, &t| constraint.advance(&s, t));
    assert!(!state.is_dead(), "{ids:?}");
    let start = 377 + MARKERS.iter().position(|m| *m == "<|start|>").unwrap() as u32;
    assert!(
        ids.contains(&start),
        "the greedy text holds a marker outside the tags: {ids:?}"
    );
}

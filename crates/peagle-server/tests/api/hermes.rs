//! Tool calls of a model whose chat template offers tools, served with `--tool-call-parser
//! hermes`: the template gets the offered tools and past calls (arguments as JSON values) and
//! results as transformers gives them, `tojson` writing as Python does; answers' `<tool_call>`
//! blocks are parsed (unit-tested in `hermes.rs`). The model is tiny-qwen3 with a template of
//! this test's own in the Hermes style.

use crate::common::{Options, TestServer};
use peagle_server::{Parsers, ReasoningParser, ServedModel, ToolCallParser};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Tools as JSON in a system turn, calls as `<tool_call>` blocks, results as `<tool_response>`:
/// the shape of Qwen's and Hermes' templates, in plain text markers.
const TEMPLATE: &str = r#"{%- if tools %}[system]
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
{% endif %}
{%- for m in messages %}
{%- if m.role == "tool" %}[tool {{ m.tool_call_id }}]
{{ m.content }}
{% else %}[{{ m.role }}]
{% if m.content %}{{ m.content }}
{% endif %}
{%- for call in m.tool_calls or [] %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{% endfor %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}[assistant]
{% if enable_thinking %}<think>
{% endif %}{% endif %}"#;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn qwen_with_tools() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture("tiny-qwen3")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.path().join("chat_template.jinja"), TEMPLATE).unwrap();
    // Room for the tools' JSON, byte-level.
    let config_path = dir.path().join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(1024);
    std::fs::write(config_path, config.to_string()).unwrap();
    dir
}

async fn server(model: &Path) -> TestServer {
    TestServer::with(Options {
        target: Some((model.to_path_buf(), None)),
        parsers: Parsers {
            tool_call: Some(ToolCallParser::Hermes),
            reasoning: Some(ReasoningParser::Qwen3),
        },
        ..Default::default()
    })
    .await
}

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather <now> & later.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "at": {"type": "integer"}},
                       "required": ["city"]}
    }}])
}

fn turns() -> Value {
    json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\",\"at\":9}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
    ])
}

async fn prompt_text(server: &TestServer, request: Value) -> String {
    let tokens = server.ok("/tokenize", request).await["tokens"].clone();
    let text = server.ok("/detokenize", json!({"tokens": tokens})).await["prompt"].clone();
    text.as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_template_gets_tools_calls_and_results() {
    let model = qwen_with_tools();
    let server = server(model.path()).await;
    let text = prompt_text(&server, json!({"messages": turns(), "tools": tools()})).await;
    let tool = r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather <now> & later.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "at": {"type": "integer"}}, "required": ["city"]}}}"#;
    let want = format!(
        "[system]\n<tools>{tool}</tools>\n[user]\nWeather?\n[assistant]\n<tool_call>\n\
         {{\"name\": \"get_weather\", \"arguments\": {{\"city\": \"Oslo\", \"at\": 9}}}}\n</tool_call>\n\
         [tool call_1]\ncold\n[assistant]\n"
    );
    assert_eq!(text, want);
    // tool_choice "none" offers none.
    let none = json!({"messages": turns(), "tools": tools(), "tool_choice": "none"});
    assert!(!prompt_text(&server, none).await.contains("<tools>"));

    // Answered, streamed or not, whatever the random model makes of it.
    let request = json!({"messages": turns(), "tools": tools(), "temperature": 0, "max_tokens": 12});
    let body = server.ok("/v1/chat/completions", request.clone()).await;
    let message = &body["choices"][0]["message"];
    let mut streamed = request;
    streamed["stream"] = json!(true);
    let content: String = server
        .stream("/v1/chat/completions", streamed)
        .await
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(content, message["content"].as_str().unwrap_or(""), "{body}");
}

/// A generation prompt that opens the thinking makes the answer reasoning up to `</think>`
/// (this random model never writes one, so all of it); one that does not leaves the answer
/// content. The conversation's own text does not count: a user who writes `</think>` or
/// `<think>` changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generation_prompt_says_whether_the_answer_starts_thinking() {
    let model = qwen_with_tools();
    let server = server(model.path()).await;
    for user in ["Weather?", "What does </think> do?", "Say <think>"] {
        for thinking in [true, false] {
            let request = json!({"messages": [{"role": "user", "content": user}], "temperature": 0,
                                 "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": thinking}});
            let body = server.ok("/v1/chat/completions", request).await;
            let message = &body["choices"][0]["message"];
            let reasoning = message["reasoning_content"].as_str().unwrap_or("");
            let content = message["content"].as_str().unwrap_or("");
            match thinking {
                true => assert!(!reasoning.is_empty() && content.is_empty(), "{user}: {body}"),
                false => assert!(reasoning.is_empty() && !content.is_empty(), "{user}: {body}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_cannot_be_rendered_are_refused() {
    let model = qwen_with_tools();
    let server = server(model.path()).await;
    let mut bad_arguments = turns();
    bad_arguments[1]["tool_calls"][0]["function"]["arguments"] = json!("{city: Oslo}");
    let mut bad_name = turns();
    bad_name[1]["tool_calls"][0]["function"]["name"] = json!("get weather");
    for (messages, param) in [
        (bad_arguments, "messages[1].tool_calls[0].function.arguments"),
        (bad_name, "messages[1].tool_calls[0].function.name"),
    ] {
        let (status, body) = server
            .call("/v1/chat/completions", json!({"messages": messages, "tools": tools()}))
            .await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["param"], param, "{body}");
    }
}

/// A parser that does not fit the model's format is a startup error, in one line.
#[test]
fn a_parser_must_fit_the_models_format() {
    let startup_error = |parsers: Parsers| {
        ServedModel::from_dir("m".into(), &fixture("tiny-qwen3"), None, parsers)
            .err()
            .unwrap()
            .to_string()
    };
    let err = startup_error(Parsers {
        tool_call: Some(ToolCallParser::Openai),
        reasoning: None,
    });
    assert!(
        err.starts_with("--tool-call-parser openai: ") && !err.contains('\n'),
        "{err}"
    );
    let err = startup_error(Parsers {
        tool_call: None,
        reasoning: Some(ReasoningParser::OpenaiGptoss),
    });
    assert!(
        err.starts_with("--reasoning-parser openai_gptoss: ") && !err.contains('\n'),
        "{err}"
    );
    let qwen = Parsers {
        tool_call: Some(ToolCallParser::Hermes),
        reasoning: Some(ReasoningParser::Qwen3),
    };
    let model = ServedModel::from_dir("m".into(), &fixture("tiny-qwen3"), None, qwen).unwrap();
    assert_eq!(model.tool_call_parser, Some(ToolCallParser::Hermes));
    assert_eq!(model.reasoning_parser, Some(ReasoningParser::Qwen3));
}

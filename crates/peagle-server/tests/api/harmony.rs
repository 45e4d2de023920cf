//! gpt-oss chats over HTTP: prompts rendered as harmony (not by the chat template), and the
//! answer's channels split into `reasoning_content`, `content` and `tool_calls`, streamed or
//! not, exactly as parsing the raw completion gives them; its tools in `harmony_tools.rs`. The
//! model is the tiny MXFP4 gpt-oss with harmony's special tokens in place of its tokenizer's
//! last seven merges, drafted for by its P-EAGLE head.

use crate::common::{Options, TestServer};
use peagle_engine::DraftModel;
use peagle_server::answer::Offer;
use peagle_server::harmony::{self, Channels, ReasoningEffort};
use peagle_server::protocol::chat::ChatMessage;
use peagle_server::{Parsers, ReasoningParser, ServedModel, ToolCallParser};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

pub const MARKERS: [&str; 7] = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// tiny-gpt-oss-mxfp4 whose tokenizer has harmony's tokens (ids 377..=383), with room for
/// harmony's system message (byte-level, it is most of 200 tokens): 256 positions, as its
/// drafter has, or `positions` for chats with tools.
pub fn harmony_gpt_oss(positions: usize) -> tempfile::TempDir {
    let src = fixture("tiny-gpt-oss-mxfp4");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let mut tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer.json")).unwrap()).unwrap();
    let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
    let first = vocab.len() - MARKERS.len();
    vocab.retain(|_, id| (id.as_u64().unwrap() as usize) < first);
    let merges = tokenizer["model"]["merges"].as_array_mut().unwrap();
    merges.truncate(merges.len() - MARKERS.len());
    let added = tokenizer["added_tokens"].as_array_mut().unwrap();
    for (i, marker) in MARKERS.iter().enumerate() {
        added.push(json!({
            "id": first + i, "content": marker, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }));
    }
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(positions);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

/// A server of `model`, drafted for by its P-EAGLE head where `drafted`.
pub async fn server(model: &Path, drafted: bool) -> TestServer {
    let draft = DraftModel {
        dir: fixture("tiny-gpt-oss-peagle"),
        k: Some(3),
        parallel: true,
    };
    TestServer::with(Options {
        target: Some((model.to_path_buf(), drafted.then_some(draft))),
        ..Default::default()
    })
    .await
}

/// Room for a conversation with tools: the drafter's 256 positions are too few.
pub const TOOL_POSITIONS: usize = 1024;

pub fn messages() -> Value {
    json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "def count"},
        {"role": "assistant", "content": "return", "reasoning_content": "think"},
        {"role": "user", "content": "print the counts"},
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_prompts_are_rendered_as_harmony() {
    let model = harmony_gpt_oss(256);
    let server = server(model.path(), true).await;
    let body = server
        .ok("/tokenize", json!({"messages": messages(), "reasoning_effort": "high"}))
        .await;
    let tokens: Vec<u32> = serde_json::from_value(body["tokens"].clone()).unwrap();
    let text = server.ok("/detokenize", json!({"tokens": tokens})).await["prompt"]
        .as_str()
        .unwrap()
        .to_string();
    let parsed: Vec<ChatMessage> = serde_json::from_value(messages()).unwrap();
    let want = harmony::render(&parsed, ReasoningEffort::High, &harmony::today(), &[]).unwrap();
    assert_eq!(text, want);
    assert!(text.starts_with("<|start|>system<|message|>You are ChatGPT"), "{text}");
    assert!(text.contains("Reasoning: high") && !text.contains("think"), "{text}");
    assert!(text.ends_with("<|end|><|start|>assistant"), "{text}");

    let (status, body) = server
        .call(
            "/v1/chat/completions",
            json!({"messages": messages(), "reasoning_effort": "max"}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "reasoning_effort", "{body}");
    let (status, body) = server
        .call(
            "/v1/chat/completions",
            json!({"messages": messages(), "add_generation_prompt": false, "continue_final_message": true}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("harmony"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_split_reasoning_from_content_streamed_or_not() {
    let model = harmony_gpt_oss(256);
    let server = server(model.path(), true).await;
    let messages = json!([{"role": "user", "content": "def count"}]);
    let request = json!({"messages": messages, "temperature": 0, "max_tokens": 40});
    let body = server.ok("/v1/chat/completions", request.clone()).await;
    let message = &body["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap_or("").to_string();
    let content = message["content"].as_str().unwrap_or("").to_string();
    for text in [&reasoning, &content] {
        assert!(MARKERS.iter().all(|m| !text.contains(m)), "{body}");
    }

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (mut s_reasoning, mut s_content) = (String::new(), String::new());
    for chunk in server.stream("/v1/chat/completions", streamed).await {
        let delta = &chunk["choices"][0]["delta"];
        s_reasoning += delta["reasoning_content"].as_str().unwrap_or("");
        s_content += delta["content"].as_str().unwrap_or("");
    }
    assert_eq!((&s_reasoning, &s_content), (&reasoning, &content));

    // The same answer as raw text with the special tokens kept, parsed here.
    let prompt = server.ok("/tokenize", json!({"messages": messages})).await["tokens"].clone();
    let stop: Vec<u32> = ["<|return|>", "<|call|>"]
        .iter()
        .map(|m| 377 + MARKERS.iter().position(|x| x == m).unwrap() as u32)
        .collect();
    let raw = server
        .ok(
            "/v1/completions",
            json!({"prompt": prompt, "temperature": 0, "max_tokens": 40,
                   "skip_special_tokens": false, "stop_token_ids": stop}),
        )
        .await;
    let text = raw["choices"][0]["text"].as_str().unwrap();
    let split = Channels::offering(Offer::new(Vec::new(), true)).split(text, true);
    assert_eq!((split.reasoning, split.content), (reasoning, content), "raw: {text:?}");
    assert_eq!(
        body["usage"]["completion_tokens"], raw["usage"]["completion_tokens"],
        "{body} {raw}"
    );
}

pub fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": true
    }})
}

/// A turn that called the tool, its result, and a question after it.
pub fn tool_turns() -> Value {
    json!([
        {"role": "user", "content": "def weather"},
        {"role": "assistant", "content": null, "reasoning_content": "call it",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
    ])
}

/// The prompt a /tokenize request renders, as text.
pub async fn prompt_text(server: &TestServer, request: Value) -> String {
    let tokens = server.ok("/tokenize", request).await["tokens"].clone();
    let text = server.ok("/detokenize", json!({"tokens": tokens})).await["prompt"].clone();
    text.as_str().unwrap().to_string()
}

/// A harmony model's tool calls and reasoning are harmony's: other parsers do not fit it.
#[test]
fn a_harmony_model_takes_no_hermes_parser() {
    let model = harmony_gpt_oss(256);
    let hermes = Parsers {
        tool_call: Some(ToolCallParser::Hermes),
        reasoning: None,
    };
    let err = ServedModel::from_dir("m".into(), model.path(), None, hermes)
        .err()
        .unwrap();
    assert!(err.to_string().starts_with("--tool-call-parser hermes: "), "{err}");
    let qwen3 = Parsers {
        tool_call: None,
        reasoning: Some(ReasoningParser::Qwen3),
    };
    let err = ServedModel::from_dir("m".into(), model.path(), None, qwen3)
        .err()
        .unwrap();
    assert!(err.to_string().starts_with("--reasoning-parser qwen3: "), "{err}");
    let own = Parsers {
        tool_call: Some(ToolCallParser::Openai),
        reasoning: Some(ReasoningParser::OpenaiGptoss),
    };
    let model = ServedModel::from_dir("m".into(), model.path(), None, own).unwrap();
    assert!(model.harmony.is_some() && model.tool_call_parser.is_none() && model.reasoning_parser.is_none());
}

/// Structured output holds a harmony answer's final message only: before harmony's
/// `<|channel|>final<|message|>`, the analysis and anything else are free. The tiny model
/// never writes that opener, so its answer under a JSON schema is its answer without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_output_waits_for_the_final_channel() {
    let model = harmony_gpt_oss(512);
    let server = server(model.path(), true).await;
    let request = json!({"messages": messages(), "temperature": 0, "max_tokens": 40});
    let free = server.ok("/v1/chat/completions", request.clone()).await;
    let mut constrained = request;
    constrained["response_format"] = json!({"type": "json_object"});
    let held = server.ok("/v1/chat/completions", constrained).await;
    let message = |body: &Value| body["choices"][0]["message"].clone();
    assert_eq!(message(&held), message(&free));
    let text = |body: &Value| {
        format!(
            "{}{}",
            message(body)["reasoning_content"].as_str().unwrap_or(""),
            message(body)["content"].as_str().unwrap_or("")
        )
    };
    assert!(
        !text(&free).trim_start().starts_with('{'),
        "the free answer is no JSON: {free}"
    );
}

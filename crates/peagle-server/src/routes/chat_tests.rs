//! The chat route's answers: messages, calls and streamed pieces, by each parser.

use super::super::chat_start::{answer_parser, answer_trigger, AnswerSetup};
use super::*;
use crate::answer::{CallParser, Offer};
use crate::harmony;
use crate::hermes::Hermes;
use crate::protocol::tools::ToolChoice;
use crate::served_model::{Parsers, ServedModel, ToolCallParser};
use crate::thinking::{PromptThinking, ReasoningParser};
use peagle_engine::FinishReason;
use serde_json::{json, Value};
use std::path::Path;

const PREAMBLE_AND_CALL: &str = "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant\
    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Rome\"}";

fn plain() -> AnswerParser {
    AnswerParser::Template {
        thinking: None,
        calls: None,
    }
}

fn harmony(tools: &[&str]) -> AnswerParser {
    let tools = tools.iter().map(|t| t.to_string()).collect();
    AnswerParser::Harmony(harmony::Channels::offering(Offer::new(tools, true)))
}

fn message(text: &str) -> (Value, bool) {
    let (message, ends_in_call) = answer_message("assistant".into(), "", text, harmony(&["get_weather"]));
    (serde_json::to_value(message).unwrap(), ends_in_call)
}

#[test]
fn an_answer_that_calls_a_tool_holds_the_call() {
    let (message, ends_in_call) = message(PREAMBLE_AND_CALL);
    assert!(ends_in_call);
    assert_eq!(message["content"], "Let me check.");
    let calls = message["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{message}");
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"), "{message}");
    assert_eq!(
        calls[0]["function"],
        json!({"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"})
    );

    let only_call = "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary \
        to=functions.get_weather<|message|>{}";
    let (message, _) = self::message(only_call);
    assert_eq!(message["content"], Value::Null, "{message}");
    assert_eq!(message["reasoning_content"], "Need it.");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");

    let (message, ends_in_call) = self::message("<|channel|>final<|message|>Sunny.");
    assert_eq!(message, json!({"role": "assistant", "content": "Sunny."}));
    assert!(!ends_in_call);
}

/// A call of a function the request did not offer (tool_choice "none", or a name it never
/// gave) is dropped, as vLLM drops it without a tool parser: no call, no tool_calls finish.
#[test]
fn a_call_of_a_function_not_offered_is_dropped() {
    let (message, ends_in_call) = answer_message("assistant".into(), "", PREAMBLE_AND_CALL, harmony(&[]));
    let message = serde_json::to_value(message).unwrap();
    assert_eq!(message, json!({"role": "assistant", "content": "Let me check."}));
    assert!(!ends_in_call);
}

/// A Hermes answer's calls come back the same way, after any echo; a model without a
/// parser answers all content.
#[test]
fn hermes_and_plain_answers_are_messages_too() {
    let text = "Looking.<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>";
    let parser = AnswerParser::Template {
        thinking: None,
        calls: Some(CallParser::Hermes(Hermes::offering(Offer::new(
            vec!["get_weather".into()],
            true,
        )))),
    };
    let (message, ends_in_call) = answer_message("assistant".into(), "I am ", text, parser);
    let message = serde_json::to_value(message).unwrap();
    assert_eq!(message["content"], "I am Looking.");
    assert_eq!(
        message["tool_calls"][0]["function"],
        json!({"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"})
    );
    assert!(ends_in_call);
    let (message, ends_in_call) = answer_message("assistant".into(), "", text, plain());
    assert_eq!(
        serde_json::to_value(message).unwrap(),
        json!({"role": "assistant", "content": text})
    );
    assert!(!ends_in_call);
}

/// `text` streamed through `parser` in pieces of `piece` characters, joined as a client
/// joins the deltas (OpenAI's SDKs join a call's pieces by index): (reasoning, content,
/// calls' functions), and whether it ends in a call.
fn streamed(mut parser: AnswerParser, text: &str, piece: usize) -> (String, String, Vec<Value>, bool) {
    let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::<Value>::new());
    let pieces = crate::answer::pieces(text, piece);
    for (i, text) in pieces.iter().enumerate() {
        let delta = serde_json::to_value(delta(parser.split(text, i + 1 == pieces.len()))).unwrap();
        reasoning += delta["reasoning_content"].as_str().unwrap_or("");
        content += delta["content"].as_str().unwrap_or("");
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
                assert_eq!(call["type"], "function");
                calls.push(call["function"].clone());
            } else {
                assert!(
                    call.get("id").is_none() && call["function"].get("name").is_none(),
                    "{call}"
                );
                let more = call["function"]["arguments"].as_str().unwrap();
                let joined = calls[index]["arguments"].as_str().unwrap().to_string() + more;
                calls[index]["arguments"] = json!(joined);
            }
        }
    }
    (reasoning, content, calls, parser.ends_in_call())
}

/// A client gets the call the whole answer holds, however the text streams.
#[test]
fn streamed_pieces_join_into_the_call() {
    for piece in [1, 3, 7] {
        let (_, content, calls, ends_in_call) = streamed(harmony(&["get_weather"]), PREAMBLE_AND_CALL, piece);
        assert_eq!(content, "Let me check.");
        assert_eq!(
            calls,
            [json!({"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"})],
            "in {piece}s"
        );
        assert!(ends_in_call);
    }
}

/// With a reasoning parser, a template model's structured output starts after `</think>`
/// unless the prompt closed the thinking; without one, at once.
#[test]
fn structured_output_starts_after_the_thinking_the_answer_starts_in() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3");
    let model = |reasoning| {
        let parsers = Parsers {
            tool_call: None,
            reasoning,
        };
        ServedModel::from_dir("m".into(), &fixture, None, parsers).unwrap()
    };
    let think_end = model(None).encode_words("</think>").unwrap();
    let (qwen3, deepseek) = (Some(ReasoningParser::Qwen3), Some(ReasoningParser::DeepseekR1));
    for (reasoning, thinking, waits) in [
        (qwen3, PromptThinking::Open, true),
        (qwen3, PromptThinking::Closed, false),
        (qwen3, PromptThinking::Neither, true),
        (deepseek, PromptThinking::Neither, true),
        (deepseek, PromptThinking::Closed, false),
        (None, PromptThinking::Open, false),
    ] {
        let want = if waits { think_end.clone() } else { Vec::new() };
        assert_eq!(
            answer_trigger(&model(reasoning), thinking).unwrap(),
            want,
            "{reasoning:?} {thinking:?}"
        );
    }
}

/// A chat template's model's answer goes through the parsers its server has: reasoning,
/// then calls of the offered tools (none looked for where none are offered), the rest
/// content; the same streamed as whole.
#[test]
fn a_template_models_answer_is_split_by_its_servers_parsers() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-qwen3");
    let model = |tool_call, reasoning| {
        let parsers = Parsers { tool_call, reasoning };
        ServedModel::from_dir("m".into(), &fixture, None, parsers).unwrap()
    };
    let qwen = model(Some(ToolCallParser::Hermes), Some(ReasoningParser::Qwen3));
    let call = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>";
    let text = format!("<think>\nweather?\n</think>\n\nLooking.{call}");
    let weather = ["get_weather".to_string()];
    let setup = |tools: &[String]| AnswerSetup {
        offer: Offer::new(tools.to_vec(), true),
        thinking: PromptThinking::Neither,
        tool_choice: ToolChoice::Auto,
    };
    let function = json!({"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"});
    for piece in [1, 4, text.len()] {
        let got = streamed(answer_parser(&qwen, &setup(&weather)), &text, piece);
        let want = (
            "\nweather?\n".to_string(),
            "\n\nLooking.".to_string(),
            vec![function.clone()],
            true,
        );
        assert_eq!(got, want, "in {piece}s");
        let got = streamed(answer_parser(&qwen, &setup(&[])), &text, piece);
        let want = (
            "\nweather?\n".to_string(),
            format!("\n\nLooking.{call}"),
            Vec::new(),
            false,
        );
        assert_eq!(got, want, "no tools, in {piece}s");
    }
    let (message, ends_in_call) = answer_message("assistant".into(), "", &text, answer_parser(&qwen, &setup(&weather)));
    let message = serde_json::to_value(message).unwrap();
    assert_eq!(
        (&message["reasoning_content"], &message["content"]),
        (&json!("\nweather?\n"), &json!("\n\nLooking."))
    );
    assert_eq!(message["tool_calls"][0]["function"], function);
    assert!(ends_in_call);
    let plain = streamed(answer_parser(&model(None, None), &setup(&weather)), &text, 3);
    assert_eq!(plain, (String::new(), text.clone(), Vec::new(), false));
    let llama = model(Some(ToolCallParser::Llama3Json), None);
    let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}";
    for piece in [1, 4, text.len()] {
        let got = streamed(answer_parser(&llama, &setup(&weather)), text, piece);
        assert_eq!(
            got,
            (String::new(), String::new(), vec![function.clone()], true),
            "in {piece}s"
        );
    }
}

#[test]
fn a_turn_that_stops_in_a_call_finishes_for_tool_calls() {
    let finish = |reason, stop_reason| Finish {
        reason,
        stop_reason,
        completion_tokens: 1,
        cached_tokens: 0,
    };
    let call_token = Some(StopReason::Token(383));
    assert_eq!(
        finish_reason(&finish(FinishReason::StopToken(383), call_token.clone()), true),
        "tool_calls"
    );
    // An end-of-sequence token that ends the call (gpt-oss's generation config lists <|call|>).
    assert_eq!(finish_reason(&finish(FinishReason::Stop, None), true), "tool_calls");
    assert_eq!(
        finish_reason(&finish(FinishReason::StopToken(383), call_token), false),
        "stop"
    );
    // Cut short in the call: its arguments may be cut too.
    assert_eq!(finish_reason(&finish(FinishReason::Length, None), true), "length");
    let stop_string = Some(StopReason::Text("}".into()));
    assert_eq!(finish_reason(&finish(FinishReason::Stop, stop_string), true), "stop");
}

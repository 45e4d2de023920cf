//! `POST /v1/chat/completions`: messages rendered with the model's chat template (or as
//! harmony for gpt-oss), each choice's answer split into reasoning, content and tool calls by
//! its parser (`answer`), n choices, streamed as `chat.completion.chunk` deltas or answered as
//! one `chat.completion`.

use super::chat_start::{start_chat, ChatFields};
use super::check_model;
use crate::answer::{join_calls, AnswerParser, Split};
use crate::choice::{Choice, Finish};
use crate::error::ApiError;
use crate::json_body::ApiJsonViews;
use crate::openapi::{ApiErrors, StreamEvent};
use crate::protocol::chat::{ChatChoice, ChatLogprobs, ChatRequest, ChatResponse, Delta, Message};
use crate::protocol::sampling::SamplingRequest;
use crate::protocol::tools::{DeltaToolCall, ToolCall};
use crate::protocol::TokenLogprob;
use crate::protocol::{response_id, unix_time, StopReason, StreamUsage, Usage};
use crate::sse::{done_event, error_event, json_event, merged};
use crate::state::AppState;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::try_join_all;
use futures_util::{Stream, StreamExt};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

/// The body: the route's own fields and the sampling fields, read as two views.
type ChatBody = ApiJsonViews<ChatRequest, SamplingRequest>;

/// What every chunk and the response repeat.
struct Meta {
    id: String,
    created: u64,
    model: String,
}

impl Meta {
    fn response(&self, object: &'static str, choices: Vec<ChatChoice>, usage: Option<Usage>) -> ChatResponse {
        ChatResponse {
            id: self.id.clone(),
            object,
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            prompt_logprobs: None,
        }
    }

    /// A chunk of choice `index`; `finish` on its last, with whether the choice ends in a call.
    fn chunk(
        &self,
        index: usize,
        delta: Delta,
        logprobs: Option<ChatLogprobs>,
        finish: Option<(&Finish, bool)>,
        usage: Option<Usage>,
    ) -> ChatResponse {
        let choice = ChatChoice {
            index,
            message: None,
            delta: Some(delta),
            logprobs,
            finish_reason: finish.map(|(f, ends_in_call)| finish_reason(f, ends_in_call)),
            stop_reason: finish.and_then(|(f, _)| f.stop_reason.clone()),
        };
        self.response("chat.completion.chunk", vec![choice], usage)
    }
}

#[utoipa::path(post, path = "/v1/chat/completions", tag = "OpenAI", security(("api_key" = [])),
    request_body = ChatBody,
    responses(
        (status = 200, description = "The chat completion; with `stream`, server-sent events each holding a \
            `chat.completion.chunk` of the same shape (`delta` for `message`), then `data: [DONE]`",
            content((ChatResponse = "application/json"), (StreamEvent = "text/event-stream"))),
        ApiErrors,
    ))]
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    ApiJsonViews(req, sampling): ChatBody,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    check_model(&state, req.model.as_deref())?;
    let streaming = req.stream.unwrap_or(false);
    let usage = StreamUsage::of(streaming, req.stream_options.as_ref())?;
    let fields = ChatFields {
        prompt: "messages",
        max_tokens: match req.max_completion_tokens {
            Some(m) => (Some(m), "max_completion_tokens"),
            None => (req.max_tokens, "max_tokens"),
        },
        held: None,
    };
    let chat = start_chat(&state, &req, sampling, fields, arrived).await?;
    let meta = Meta {
        id: response_id("chatcmpl-", &headers),
        created: unix_time(),
        model: state.model.name.clone(),
    };
    let parsers = chat.choices.iter().map(|_| chat.parser(&state.model)).collect();
    if streaming {
        let opening = Delta {
            role: Some(chat.role),
            content: Some(chat.echo),
            ..Delta::default()
        };
        return Ok(stream(meta, chat.choices, opening, chat.prompt_tokens, usage, parsers).into_response());
    }
    let mut outcomes = try_join_all(chat.choices.into_iter().map(Choice::collect)).await?;
    let completion_tokens = outcomes.iter().map(|o| o.finish.completion_tokens).sum();
    let cached_tokens = outcomes[0].finish.cached_tokens;
    // Every choice scores the same prompt.
    let prompt_logprobs = chat
        .prompt_logprobs
        .then(|| std::mem::take(&mut outcomes[0].prompt_logprobs));
    let choices = outcomes
        .into_iter()
        .zip(parsers)
        .enumerate()
        .map(|(index, (o, parser))| {
            let (message, ends_in_call) = answer_message(chat.role.clone(), &chat.echo, &o.text, parser);
            ChatChoice {
                index,
                finish_reason: Some(finish_reason(&o.finish, ends_in_call)),
                message: Some(message),
                delta: None,
                logprobs: chat.logprobs.map(|_| ChatLogprobs::new(&o.logprobs)),
                stop_reason: o.finish.stop_reason,
            }
        })
        .collect();
    let usage = Usage::finished(chat.prompt_tokens, completion_tokens, cached_tokens);
    let response = ChatResponse {
        prompt_logprobs,
        ..meta.response("chat.completion", choices, Some(usage))
    };
    Ok(Json(response).into_response())
}

/// An answer as a message, after `echo`: its reasoning, its content (null where it only
/// called tools) and its calls, each with a new id; and whether it ends in a call.
fn answer_message(role: String, echo: &str, text: &str, mut parser: AnswerParser) -> (Message, bool) {
    let split = parser.split(text, true);
    let calls: Vec<ToolCall> = join_calls(split.calls)
        .into_iter()
        .map(|(name, arguments)| ToolCall::new(name, arguments))
        .collect();
    let content = echo.to_string() + &split.content;
    // Null where the answer was only reasoning or calls, as vLLM has it.
    let nothing_else = split.reasoning.is_empty() && calls.is_empty();
    let message = Message {
        role,
        content: (!content.is_empty() || nothing_else).then_some(content),
        reasoning_content: (!split.reasoning.is_empty()).then_some(split.reasoning),
        tool_calls: (!calls.is_empty()).then_some(calls),
    };
    (message, parser.ends_in_call())
}

/// OpenAI's finish reason: a turn that stopped in a call (on harmony's `<|call|>`, or an end
/// token) ends for "tool_calls"; one cut short in a call keeps its own reason, "length", or
/// "stop" for a stop string, as its arguments may be cut too.
fn finish_reason(finish: &Finish, ends_in_call: bool) -> &'static str {
    let stop_string = matches!(finish.stop_reason, Some(StopReason::Text(_)));
    match finish.reason.as_str() {
        "stop" if ends_in_call && !stop_string => "tool_calls",
        reason => reason,
    }
}

/// Streams the choices, each opening with `opening` (the role and any echo), each choice's
/// text split by its parser.
fn stream(
    meta: Meta,
    choices: Vec<Choice>,
    opening: Delta,
    prompt_tokens: usize,
    usage: StreamUsage,
    mut parsers: Vec<AnswerParser>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let with_logprobs = |tokens: &[TokenLogprob]| (!tokens.is_empty()).then(|| ChatLogprobs::new(tokens));
    let mut generated = vec![0; choices.len()];
    let events = async_stream::stream! {
        for index in 0..choices.len() {
            let delta = opening.clone();
            let so_far = usage.per_chunk.then(|| Usage::new(prompt_tokens, 0));
            yield json_event(&meta.chunk(index, delta, None, None, so_far));
        }
        let mut updates = merged(choices);
        let mut completion_tokens = 0;
        let mut cached_tokens = 0;
        while let Some((index, update)) = updates.next().await {
            let update = match update {
                Ok(update) => update,
                Err(e) => {
                    yield error_event(&e);
                    break;
                }
            };
            let finish = update.finish;
            if update.text.is_empty() && update.logprobs.is_empty() && finish.is_none() {
                continue;
            }
            completion_tokens += finish.as_ref().map_or(0, |f| f.completion_tokens);
            if index == 0 {
                cached_tokens = finish.as_ref().map_or(cached_tokens, |f| f.cached_tokens);
            }
            generated[index] += update.tokens;
            let so_far = usage.per_chunk.then(|| Usage::new(prompt_tokens, generated[index]));
            let delta = delta(parsers[index].split(&update.text, finish.is_some()));
            let empty = delta.content.is_none() && delta.reasoning_content.is_none() && delta.tool_calls.is_none();
            if empty && update.logprobs.is_empty() && finish.is_none() {
                continue;
            }
            let finish = finish.as_ref().map(|f| (f, parsers[index].ends_in_call()));
            yield json_event(&meta.chunk(index, delta, with_logprobs(&update.logprobs), finish, so_far));
        }
        if usage.at_end {
            let usage = Usage::finished(prompt_tokens, completion_tokens, cached_tokens);
            yield json_event(&meta.response("chat.completion.chunk", Vec::new(), Some(usage)));
        }
        yield done_event();
    };
    Sse::new(events.map(Ok))
}

/// A stream chunk's delta from what an update added.
fn delta(split: Split) -> Delta {
    let calls: Vec<DeltaToolCall> = split
        .calls
        .into_iter()
        .map(|piece| match piece.name {
            Some(name) => DeltaToolCall::start(piece.index, name, piece.arguments),
            None => DeltaToolCall::more(piece.index, piece.arguments),
        })
        .collect();
    Delta {
        role: None,
        content: (!split.content.is_empty()).then_some(split.content),
        reasoning_content: (!split.reasoning.is_empty()).then_some(split.reasoning),
        tool_calls: (!calls.is_empty()).then_some(calls),
    }
}

#[cfg(test)]
mod tests {
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
        let (message, ends_in_call) =
            answer_message("assistant".into(), "", &text, answer_parser(&qwen, &setup(&weather)));
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
}

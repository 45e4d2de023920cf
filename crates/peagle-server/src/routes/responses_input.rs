//! A Responses request read as the chat it is: `instructions`, a stored response's
//! conversation and the input items become chat messages, the flat function tools chat's
//! tools, and `text.format` structured output. What cannot be honoured here is a 400 naming
//! the field.

use super::chat_start::ChatFields;
use crate::error::ApiError;
use crate::harmony::ReasoningEffort;
use crate::params::logprobs_count;
use crate::protocol::chat::{ChatMessage, ChatRequest, ContentPart, MessageContent};
use crate::protocol::responses::{InputItem, ItemContent, ItemPart, ResponsesInput, ResponsesRequest};
use crate::protocol::structured::Asked;
use crate::protocol::tools::{
    check_function, check_kind, check_name, FunctionCall, FunctionDefinition, Tool, ToolCall,
};
use peagle_grammar::Spec;
use serde_json::{json, Value};
use std::collections::HashMap;

/// The chat `req` asks for, going on from the conversation `before` (a stored response's),
/// and the fields that chat's checks name.
pub fn chat_request(req: &ResponsesRequest, before: &[ChatMessage]) -> Result<(ChatRequest, ChatFields), ApiError> {
    refuse_unkept(req)?;
    let with_logprobs = req.include.iter().flatten().any(|i| i == OUTPUT_LOGPROBS);
    let effort = match req.reasoning.as_ref().and_then(|r| r.effort.as_deref()) {
        Some(effort) => Some(checked_effort(effort)?),
        None => None,
    };
    let chat = ChatRequest {
        model: req.model.clone(),
        messages: messages(req.instructions.as_deref(), before, &req.input)?,
        max_tokens: None,
        max_completion_tokens: None,
        logprobs: Some(with_logprobs),
        top_logprobs: req.top_logprobs.filter(|_| with_logprobs),
        stream: req.stream,
        stream_options: None,
        add_generation_prompt: None,
        continue_final_message: None,
        echo: None,
        chat_template_kwargs: None,
        chat_template: None,
        add_special_tokens: None,
        reasoning_effort: effort,
        tools: Some(tools(req)?),
        tool_choice: tool_choice(req.tool_choice.as_ref())?,
        parallel_tool_calls: req.parallel_tool_calls,
    };
    let fields = ChatFields {
        prompt: "input",
        max_tokens: (req.max_output_tokens, "max_output_tokens"),
        held: text_format(req.text.as_ref().and_then(|t| t.format.as_ref()))?,
    };
    Ok((chat, fields))
}

fn invalid(param: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(Some(param), format!("{param}: {why}"))
}

/// What `include` may ask for: output logprobs, and encrypted reasoning, which stateless
/// clients ask for and of which none is written (the reasoning items come back without it).
const INCLUDABLE: [&str; 2] = [OUTPUT_LOGPROBS, "reasoning.encrypted_content"];
const OUTPUT_LOGPROBS: &str = "message.output_text.logprobs";

/// Fields that need what this server does not keep (conversations) or give (truncation of the
/// input).
fn refuse_unkept(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(invalid(
            "conversation",
            "conversations are not kept by this server; use previous_response_id",
        ));
    }
    let mut included = req.include.iter().flatten();
    if let Some(asked) = included.find(|i| !INCLUDABLE.contains(&i.as_str())) {
        return Err(invalid("include", format!("{asked:?} is not supported")));
    }
    // Held to its bounds even where unused, as the API's schema has it.
    if let Some(top) = req.top_logprobs {
        logprobs_count(top, "top_logprobs")?;
    }
    check_metadata(req.metadata.as_ref())?;
    match req.truncation.as_deref() {
        None | Some("disabled") => Ok(()),
        Some(other) => Err(invalid(
            "truncation",
            format!("only \"disabled\" is supported (an input too long for the context is refused), not {other:?}"),
        )),
    }
}

/// OpenAI's bounds on `metadata`, which a stored response keeps: an object of at most 16
/// keys of up to 64 characters, each a string of up to 512.
fn check_metadata(metadata: Option<&Value>) -> Result<(), ApiError> {
    let fields = match metadata {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(fields)) if fields.len() <= 16 => fields,
        Some(_) => return Err(invalid("metadata", "an object of at most 16 keys is expected")),
    };
    for (key, value) in fields {
        let fits = key.chars().count() <= 64 && value.as_str().is_some_and(|v| v.chars().count() <= 512);
        if !fits {
            return Err(invalid(
                "metadata",
                format!("{key:?}: keys of up to 64 characters, each a string of up to 512, are expected"),
            ));
        }
    }
    Ok(())
}

fn checked_effort(effort: &str) -> Result<String, ApiError> {
    ReasoningEffort::parse(effort)
        .map(|e| e.as_str().to_string())
        .map_err(|_| invalid("reasoning.effort", format!("low, medium or high, not {effort:?}")))
}

/// The conversation as chat messages: `instructions` as a leading system message, the
/// conversation `before`, then the items in order. A function call joins the assistant message just before it (the answer
/// it was part of), or starts one; a reasoning item goes to the assistant message or call
/// right after it, and is dropped where another item follows, as a past turn's reasoning is
/// rendered only with its answer.
fn messages(
    instructions: Option<&str>,
    before: &[ChatMessage],
    input: &ResponsesInput,
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(text) = instructions {
        messages.push(message("system", Some(MessageContent::Text(text.to_string()))));
    }
    messages.extend_from_slice(before);
    let items = match input {
        ResponsesInput::Text(text) => {
            messages.push(message("user", Some(MessageContent::Text(text.clone()))));
            return Ok(messages);
        }
        ResponsesInput::Items(items) if items.is_empty() => return Err(invalid("input", "no items")),
        ResponsesInput::Items(items) => items,
    };
    let mut reasoning: Option<String> = None;
    let mut after_assistant = false;
    let mut calls: Vec<String> = before
        .iter()
        .flat_map(|m| m.tool_calls.iter().flatten())
        .map(|call| call.id.clone())
        .collect();
    let given = messages.len();
    // Item ids are the cursors of the stored input's listing, so one id names one item.
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let field = |name: &str| format!("input[{i}].{name}");
        if let Some(id) = item.id.as_deref() {
            if let Some(first) = ids.insert(id, i) {
                return Err(invalid(&field("id"), format!("{id:?} is input[{first}]'s id too")));
            }
        }
        let kind = match (item.kind.as_deref(), &item.role) {
            (Some(kind), _) => kind,
            (None, Some(_)) => "message",
            (None, None) => return Err(invalid(&field("type"), "an item needs a type or a role")),
        };
        match kind {
            "message" => {
                let role = item.role.as_deref().unwrap_or_default();
                if !matches!(role, "user" | "system" | "developer" | "assistant") {
                    return Err(invalid(
                        &field("role"),
                        format!("expected user, system, developer or assistant, not {role:?}"),
                    ));
                }
                let given = item
                    .content
                    .as_ref()
                    .ok_or_else(|| invalid(&field("content"), "missing"))?;
                let text = content(given, &field("content"), &["input_text", "output_text"])?;
                let mut m = message(role, Some(text));
                after_assistant = role == "assistant";
                let before = reasoning.take();
                if after_assistant {
                    m.reasoning_content = before;
                }
                messages.push(m);
            }
            "function_call" => {
                let call = function_call(item, &field)?;
                calls.push(call.id.clone());
                match messages.last_mut().filter(|_| after_assistant) {
                    Some(last) => {
                        if let Some(more) = reasoning.take() {
                            let before = last.reasoning_content.take();
                            last.reasoning_content = Some(before.map_or(more.clone(), |b| format!("{b}\n{more}")));
                        }
                        last.tool_calls.get_or_insert_with(Vec::new).push(call);
                    }
                    None => {
                        let mut m = message("assistant", None);
                        m.reasoning_content = reasoning.take();
                        m.tool_calls = Some(vec![call]);
                        messages.push(m);
                    }
                }
                after_assistant = true;
            }
            "function_call_output" => {
                let call_id = required(&item.call_id, &field("call_id"))?;
                if !calls.contains(&call_id) {
                    return Err(invalid(
                        &field("call_id"),
                        format!("no function_call item before it has call_id {call_id:?}"),
                    ));
                }
                let output = item
                    .output
                    .as_ref()
                    .ok_or_else(|| invalid(&field("output"), "missing"))?;
                let mut m = message(
                    "tool",
                    Some(content(output, &field("output"), &["input_text", "output_text"])?),
                );
                m.tool_call_id = Some(call_id);
                messages.push(m);
                after_assistant = false;
                reasoning = None;
            }
            "reasoning" => {
                let said = reasoning_text(item, &field)?;
                reasoning = Some(match reasoning.take() {
                    Some(before) => format!("{before}\n{said}"),
                    None => said,
                });
            }
            other => {
                return Err(invalid(
                    &field("type"),
                    format!("expected message, function_call, function_call_output or reasoning, not {other:?}"),
                ))
            }
        }
    }
    if messages.len() == given {
        return Err(invalid(
            "input",
            "no message, function_call or function_call_output item",
        ));
    }
    Ok(messages)
}

fn message(role: &str, content: Option<MessageContent>) -> ChatMessage {
    ChatMessage {
        role: role.to_string(),
        content,
        reasoning_content: None,
        tool_calls: None,
        tool_call_id: None,
    }
}

fn required(value: &Option<String>, field: &str) -> Result<String, ApiError> {
    value.clone().ok_or_else(|| invalid(field, "missing"))
}

fn function_call(item: &InputItem, field: &dyn Fn(&str) -> String) -> Result<ToolCall, ApiError> {
    let name = required(&item.name, &field("name"))?;
    check_name(&name, &field("name"))?;
    let arguments = required(&item.arguments, &field("arguments"))?;
    if !arguments.trim().is_empty() {
        let parsed = serde_json::from_str::<Value>(&arguments);
        parsed.map_err(|e| invalid(&field("arguments"), format!("not JSON: {e}")))?;
    }
    Ok(ToolCall {
        id: required(&item.call_id, &field("call_id"))?,
        kind: "function".into(),
        function: FunctionCall { name, arguments },
    })
}

/// A reasoning item's text: its `reasoning_text` parts, or where it has none its
/// `summary_text` parts, joined by newlines.
fn reasoning_text(item: &InputItem, field: &dyn Fn(&str) -> String) -> Result<String, ApiError> {
    let (parts, field, kind) = match (&item.content, &item.summary) {
        (Some(ItemContent::Text(text)), _) => return Ok(text.clone()),
        (Some(ItemContent::Parts(parts)), _) => (parts, field("content"), "reasoning_text"),
        (None, Some(summary)) => (summary, field("summary"), "summary_text"),
        (None, None) => return Err(invalid(&field("content"), "missing")),
    };
    let texts = text_parts(parts, &field, &[kind])?;
    Ok(texts.into_iter().filter_map(|p| p.text).collect::<Vec<_>>().join("\n"))
}

/// Content as a chat message holds it: text, or text parts (of the `kinds`), which the chat
/// joins by its model's rule; other parts are refused.
fn content(content: &ItemContent, field: &str, kinds: &[&str]) -> Result<MessageContent, ApiError> {
    match content {
        ItemContent::Text(text) => Ok(MessageContent::Text(text.clone())),
        ItemContent::Parts(parts) => Ok(MessageContent::Parts(text_parts(parts, field, kinds)?)),
    }
}

fn text_parts(parts: &[ItemPart], field: &str, kinds: &[&str]) -> Result<Vec<ContentPart>, ApiError> {
    parts
        .iter()
        .enumerate()
        .map(|(j, part)| match (&part.text, kinds.contains(&part.kind.as_str())) {
            (Some(text), true) => Ok(ContentPart {
                kind: "text".into(),
                text: Some(text.clone()),
            }),
            _ => Err(invalid(
                &format!("{field}[{j}]"),
                format!(
                    "only {} parts with text are supported, not {:?}",
                    kinds.join(" or "),
                    part.kind
                ),
            )),
        })
        .collect()
}

/// The function tools as chat offers them; their names are checked here, so that a refusal
/// names the Responses field.
fn tools(req: &ResponsesRequest) -> Result<Vec<Tool>, ApiError> {
    let mut functions: Vec<FunctionDefinition> = Vec::new();
    for (i, tool) in req.tools.iter().flatten().enumerate() {
        let field = |name: &str| format!("tools[{i}].{name}");
        check_kind(&tool.kind, &field("type"))?;
        let function = FunctionDefinition {
            name: required(&tool.name, &field("name"))?,
            description: tool.description.clone(),
            parameters: tool.parameters.clone(),
            strict: tool.strict,
        };
        check_function(&function, &functions, field)?;
        functions.push(function);
    }
    let tool = |function| Tool {
        kind: "function".into(),
        function,
    };
    Ok(functions.into_iter().map(tool).collect())
}

/// `tool_choice` in chat's spelling: `{"type": "function", "name"}` names the function in a
/// `function` object there.
fn tool_choice(choice: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let named = |v: &Value| match (v["type"].as_str(), v["name"].as_str()) {
        (Some("function"), Some(name)) => Some(json!({"type": "function", "function": {"name": name}})),
        _ => None,
    };
    match choice {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if matches!(s.as_str(), "auto" | "none" | "required") => Ok(choice.cloned()),
        Some(v) => named(v).map(Some).ok_or_else(|| {
            invalid(
                "tool_choice",
                "expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
            )
        }),
    }
}

/// What `text.format` holds the answer to: nothing for `text`, any JSON object, or JSON
/// that `schema` accepts.
fn text_format(format: Option<&Value>) -> Result<Option<Asked>, ApiError> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let spec = match format["type"].as_str() {
        Some("text") => return Ok(None),
        Some("json_object") => Spec::JsonObject { whitespace: None },
        Some("json_schema") => match &format["schema"] {
            schema @ Value::Object(_) => Spec::JsonSchema {
                schema: schema.clone(),
                whitespace: None,
            },
            _ => return Err(invalid("text.format.schema", "a JSON Schema object is expected")),
        },
        _ => {
            return Err(invalid(
                "text.format.type",
                "expected \"text\", \"json_object\" or \"json_schema\"",
            ))
        }
    };
    Ok(Some(Asked {
        spec,
        param: "text.format",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message as (role, text, reasoning, calls as `id:name(arguments)`, answered call).
    type Read = (String, Option<String>, Option<String>, Vec<String>, Option<String>);

    fn read(input: Value) -> Vec<Read> {
        let input: ResponsesInput = serde_json::from_value(input).unwrap();
        messages(Some("Be brief."), &[], &input)
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let calls = m.tool_calls.iter().flatten();
                let calls = calls.map(|c| format!("{}:{}({})", c.id, c.function.name, c.function.arguments));
                (
                    m.role.clone(),
                    m.text(i, "\n").unwrap(),
                    m.reasoning_content.clone(),
                    calls.collect(),
                    m.tool_call_id.clone(),
                )
            })
            .collect()
    }

    fn some(text: &str) -> Option<String> {
        Some(text.to_string())
    }

    #[test]
    fn items_become_the_chat_they_describe() {
        let got = read(json!([
            {"role": "user", "content": [{"type": "input_text", "text": "Weather"}, {"type": "input_text", "text": "in Oslo?"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "unused"}],
             "content": [{"type": "reasoning_text", "text": "Call it."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "cold"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Answer."}]},
            {"type": "function_call", "call_id": "c3", "name": "get_weather", "arguments": "{}"},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "dropped"}]},
            {"role": "developer", "content": "Use metric units."},
            {"role": "assistant", "content": "Fine."},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Once more."}]},
            {"type": "function_call", "call_id": "c4", "name": "get_time", "arguments": ""},
        ]));
        let want = vec![
            ("system".into(), some("Be brief."), None, vec![], None),
            ("user".into(), some("Weather\nin Oslo?"), None, vec![], None),
            (
                "assistant".into(),
                some("Checking."),
                some("Call it."),
                vec!["c1:get_weather({\"city\":\"Oslo\"})".into(), "c2:get_time({})".into()],
                None,
            ),
            ("tool".into(), some("cold"), None, vec![], some("c1")),
            ("tool".into(), some("noon"), None, vec![], some("c2")),
            (
                "assistant".into(),
                None,
                some("Answer."),
                vec!["c3:get_weather({})".into()],
                None,
            ),
            ("developer".into(), some("Use metric units."), None, vec![], None),
            (
                "assistant".into(),
                some("Fine."),
                some("Once more."),
                vec!["c4:get_time()".into()],
                None,
            ),
        ];
        assert_eq!(got, want);
        let text: ResponsesInput = serde_json::from_value(json!("Hi")).unwrap();
        let chat = messages(None, &[], &text).unwrap();
        assert_eq!((chat.len(), chat[0].role.as_str()), (1, "user"));
    }

    #[test]
    fn an_item_id_names_one_item() {
        let input = json!([
            {"id": "msg_1", "role": "user", "content": "Hi"},
            {"id": "msg_2", "role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Again"},
            {"id": "msg_1", "role": "user", "content": "Hi"},
        ]);
        let input: ResponsesInput = serde_json::from_value(input).unwrap();
        let want = ApiError::invalid(Some("input[3].id"), "input[3].id: \"msg_1\" is input[0]'s id too");
        assert_eq!(messages(None, &[], &input).unwrap_err(), want);
    }
}

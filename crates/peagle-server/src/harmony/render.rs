//! A chat request as a harmony prompt, as vLLM builds it for gpt-oss:
//! - a system message with the model identity, knowledge cutoff, the conversation's start
//!   date, the reasoning effort and the valid channels, and, where function tools are
//!   offered, that calls to them go to the commentary channel;
//! - a developer message with a leading `system` or `developer` message's text as its
//!   `# Instructions` and the offered tools as its `# Tools` (their parameters as
//!   `typescript` writes them); a later `system` or `developer` message becomes a developer
//!   message of its own, in place;
//! - a past assistant turn is its reasoning on the `analysis` channel and its answer on
//!   `final`; a turn that called tools is its text and a message a call on `commentary`, each
//!   call to `functions.NAME` and ended by `<|call|>`; a tool's result is a message from
//!   `functions.NAME` (the call's name, found by `tool_call_id`) to the assistant;
//! - reasoning that comes before the last `final` answer is dropped (the model was trained to
//!   see only the current turn's: a turn still calling tools keeps its own);
//! - the prompt ends by opening the assistant's turn.

use super::typescript::typescript;
use super::{ReasoningEffort, CALL, CHANNEL, END, MESSAGE, START};
use crate::error::ApiError;
use crate::protocol::chat::ChatMessage;
use crate::protocol::tools::FunctionDefinition;
use std::collections::HashMap;

const IDENTITY: &str = "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06";
const CHANNELS: &str = "# Valid channels: analysis, commentary, final. Channel must be included for every message.";
const TOOL_CHANNEL: &str = "Calls to these tools must go to the commentary channel: 'functions'.";

/// One harmony message.
struct Turn {
    /// Its role, or for a tool's result the tool (`functions.NAME`).
    author: String,
    /// The tool a call is for, or `assistant` for a tool's result.
    recipient: Option<String>,
    channel: Option<&'static str>,
    /// `json` for a call's arguments.
    content_type: Option<&'static str>,
    text: String,
}

impl Turn {
    fn new(author: &str, channel: Option<&'static str>, text: String) -> Self {
        Self {
            author: author.to_string(),
            recipient: None,
            channel,
            content_type: None,
            text,
        }
    }

    /// The message with its header in harmony's order (author, recipient, channel, content
    /// type); an assistant's message to a tool, a call, ends with `<|call|>`.
    fn render_into(&self, prompt: &mut String) {
        *prompt += START;
        *prompt += &self.author;
        if let Some(recipient) = &self.recipient {
            *prompt += " to=";
            *prompt += recipient;
        }
        if let Some(channel) = self.channel {
            *prompt += CHANNEL;
            *prompt += channel;
        }
        if let Some(content_type) = self.content_type {
            *prompt += " ";
            *prompt += content_type;
        }
        *prompt += MESSAGE;
        *prompt += &self.text;
        let call = self.author == "assistant" && self.recipient.is_some();
        *prompt += if call { CALL } else { END };
    }
}

/// The prompt text of `messages` with `tools` offered, the conversation starting on `date`
/// (YYYY-MM-DD).
pub fn render(
    messages: &[ChatMessage],
    effort: ReasoningEffort,
    date: &str,
    tools: &[FunctionDefinition],
) -> Result<String, ApiError> {
    let channels = match tools.is_empty() {
        true => CHANNELS.to_string(),
        false => format!("{CHANNELS}\n{TOOL_CHANNEL}"),
    };
    let system = format!(
        "{IDENTITY}\nCurrent date: {date}\n\nReasoning: {}\n\n{channels}",
        effort.as_str()
    );
    let mut turns = vec![Turn::new("system", None, system)];
    let leading = messages
        .first()
        .filter(|m| matches!(m.role.as_str(), "system" | "developer"));
    let instructions = leading.map(|m| m.text(0, "")).transpose()?.flatten();
    if instructions.as_deref().is_some_and(|i| !i.is_empty()) || !tools.is_empty() {
        let mut sections: Vec<String> = instructions.iter().map(|i| format!("# Instructions\n\n{i}")).collect();
        if !tools.is_empty() {
            sections.push(tools_section(tools));
        }
        turns.push(Turn::new("developer", None, sections.join("\n\n")));
    }
    let names = call_names(messages);
    for (i, m) in messages.iter().enumerate().skip(usize::from(leading.is_some())) {
        message_turns(m, i, &names, &mut turns)?;
    }
    let last_final = turns.iter().rposition(|t| t.channel == Some("final"));
    let mut prompt = String::new();
    for (i, turn) in turns.iter().enumerate() {
        if turn.channel == Some("analysis") && last_final.is_some_and(|f| i < f) {
            continue;
        }
        turn.render_into(&mut prompt);
    }
    prompt += START;
    prompt += "assistant";
    Ok(prompt)
}

/// Message `i`'s harmony messages, added to `turns`.
fn message_turns(
    m: &ChatMessage,
    i: usize,
    call_names: &HashMap<&str, &str>,
    turns: &mut Vec<Turn>,
) -> Result<(), ApiError> {
    let field = |name: &str| format!("messages[{i}].{name}");
    let text = m.text(i, "")?;
    match m.role.as_str() {
        "system" | "developer" => {
            if let Some(text) = text {
                turns.push(Turn::new("developer", None, format!("# Instructions\n\n{text}")));
            }
        }
        "user" => turns.push(Turn::new("user", None, text.unwrap_or_default())),
        "assistant" => {
            let calls = m.tool_calls.as_deref().unwrap_or_default();
            let text = text.filter(|t| !t.is_empty());
            if let (Some(text), false) = (&text, calls.is_empty()) {
                turns.push(Turn::new("assistant", Some("commentary"), text.clone()));
            }
            if let Some(reasoning) = m.reasoning_content.as_ref().filter(|r| !r.is_empty()) {
                turns.push(Turn::new("assistant", Some("analysis"), reasoning.clone()));
            }
            for (j, call) in calls.iter().enumerate() {
                call.check(i, j)?;
                turns.push(Turn {
                    recipient: Some(format!("functions.{}", call.function.name)),
                    content_type: Some("json"),
                    ..Turn::new("assistant", Some("commentary"), call.function.arguments.clone())
                });
            }
            if let (Some(text), true) = (text, calls.is_empty()) {
                turns.push(Turn::new("assistant", Some("final"), text));
            }
        }
        "tool" => {
            let id = m.tool_call_id.as_deref().ok_or_else(|| {
                ApiError::invalid(
                    Some(&field("tool_call_id")),
                    format!("{}: a tool message names the call it answers", field("tool_call_id")),
                )
            })?;
            let name = call_names.get(id).ok_or_else(|| {
                ApiError::invalid(
                    Some(&field("tool_call_id")),
                    format!("{}: no assistant message has a tool call {id:?}", field("tool_call_id")),
                )
            })?;
            turns.push(Turn {
                recipient: Some("assistant".into()),
                ..Turn::new(
                    &format!("functions.{name}"),
                    Some("commentary"),
                    text.unwrap_or_default(),
                )
            });
        }
        other => {
            return Err(ApiError::invalid(
                Some(&field("role")),
                format!("unknown role {other:?}: expected system, developer, user, assistant or tool"),
            ))
        }
    }
    Ok(())
}

/// The function each tool call id of the conversation's assistant messages names.
fn call_names(messages: &[ChatMessage]) -> HashMap<&str, &str> {
    messages
        .iter()
        .flat_map(|m| m.tool_calls.as_deref().unwrap_or_default())
        .map(|call| (call.id.as_str(), call.function.name.as_str()))
        .collect()
}

/// The developer message's `# Tools` section: a `functions` namespace with a type a tool,
/// its description above it as comments.
fn tools_section(tools: &[FunctionDefinition]) -> String {
    let mut lines = vec!["## functions\n".to_string(), "namespace functions {\n".to_string()];
    for tool in tools {
        let description = tool.description.as_deref().unwrap_or_default();
        lines.extend(description.lines().map(|line| format!("// {line}")));
        lines.push(match &tool.parameters {
            Some(parameters) => format!("type {} = (_: {}) => any;\n", tool.name, typescript(parameters, "")),
            None => format!("type {} = () => any;\n", tool.name),
        });
    }
    lines.push("} // namespace functions".into());
    format!("# Tools\n\n{}", lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::tools::{offered_tools, Tool, ToolChoice};
    use serde::Deserialize;

    /// A conversation and the prompt the openai-harmony package renders for it, as vLLM maps
    /// the request (scripts/make_harmony_fixtures.py).
    #[derive(Deserialize)]
    struct Case {
        name: String,
        messages: Vec<ChatMessage>,
        reasoning_effort: Option<ReasoningEffort>,
        tools: Option<Vec<Tool>>,
        tool_choice: Option<serde_json::Value>,
        rendered: String,
        conversation_start_date: String,
    }

    fn cases() -> Vec<Case> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/harmony/renders.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn prompts_match_openai_harmony() {
        let all = cases();
        assert_eq!(all.len(), 11);
        for case in all {
            let effort = case.reasoning_effort.unwrap_or_default();
            let tools = offered_tools(
                case.tools.as_deref(),
                &ToolChoice::of(case.tool_choice.as_ref()).unwrap(),
            )
            .unwrap();
            let prompt = render(&case.messages, effort, &case.conversation_start_date, &tools).unwrap();
            assert_eq!(prompt, case.rendered, "{}", case.name);
        }
    }

    /// A tool's result must answer a call of the conversation: its name comes from the call.
    #[test]
    fn a_tool_result_names_a_call() {
        let case = cases().into_iter().find(|c| c.name == "tool_call_in_progress").unwrap();
        let mut messages = case.messages;
        let result = messages.len() - 1;
        messages[result].tool_call_id = Some("call_9".into());
        let err = render(&messages, ReasoningEffort::Medium, "2025-06-28", &[]).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[3].tool_call_id"));
        assert!(err.message.contains("\"call_9\""), "{}", err.message);
        messages[result].tool_call_id = None;
        let err = render(&messages, ReasoningEffort::Medium, "2025-06-28", &[]).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[3].tool_call_id"));
    }
}

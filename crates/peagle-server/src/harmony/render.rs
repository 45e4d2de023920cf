//! A chat request as a harmony prompt, as vLLM builds it for gpt-oss:
//! - a system message with the model identity, knowledge cutoff, the conversation's start
//!   date, the reasoning effort and the valid channels;
//! - a leading `system` or `developer` message becomes the developer message's
//!   `# Instructions`, and a later one a developer message of its own, in place;
//! - a past assistant turn is its reasoning on the `analysis` channel and its answer on
//!   `final`, and reasoning that comes before the last `final` answer is dropped (the model
//!   was trained to see only the current turn's);
//! - the prompt ends by opening the assistant's turn.

use super::{ReasoningEffort, CHANNEL, END, MESSAGE, START};
use crate::error::ApiError;
use crate::protocol::chat::ChatMessage;

const IDENTITY: &str = "You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06";
const CHANNELS: &str = "# Valid channels: analysis, commentary, final. Channel must be included for every message.";

/// One harmony message: its author, its channel (assistant messages only) and its text.
struct Turn {
    role: &'static str,
    channel: Option<&'static str>,
    text: String,
}

/// The prompt text of `messages`, with the conversation starting on `date` (YYYY-MM-DD).
pub fn render(messages: &[ChatMessage], effort: ReasoningEffort, date: &str) -> Result<String, ApiError> {
    let system = format!(
        "{IDENTITY}\nCurrent date: {date}\n\nReasoning: {}\n\n{CHANNELS}",
        effort.as_str()
    );
    let mut turns = vec![Turn {
        role: "system",
        channel: None,
        text: system,
    }];
    for (i, m) in messages.iter().enumerate() {
        let field = |name: &str| format!("messages[{i}].{name}");
        m.refuse_tool_calling(i)?;
        let text = m.text(i, "")?.unwrap_or_default();
        match m.role.as_str() {
            "system" | "developer" => turns.push(Turn {
                role: "developer",
                channel: None,
                text: format!("# Instructions\n\n{text}"),
            }),
            "user" => turns.push(Turn {
                role: "user",
                channel: None,
                text,
            }),
            "assistant" => {
                if let Some(reasoning) = m.reasoning_content.as_ref().filter(|r| !r.is_empty()) {
                    turns.push(Turn {
                        role: "assistant",
                        channel: Some("analysis"),
                        text: reasoning.clone(),
                    });
                }
                if !text.is_empty() {
                    turns.push(Turn {
                        role: "assistant",
                        channel: Some("final"),
                        text,
                    });
                }
            }
            other => {
                return Err(ApiError::invalid(
                    Some(&field("role")),
                    format!("unknown role {other:?}: expected system, developer, user or assistant"),
                ))
            }
        }
    }
    let last_final = turns.iter().rposition(|t| t.channel == Some("final"));
    let mut prompt = String::new();
    for (i, turn) in turns.iter().enumerate() {
        if turn.channel == Some("analysis") && last_final.is_some_and(|f| i < f) {
            continue;
        }
        prompt += START;
        prompt += turn.role;
        if let Some(channel) = turn.channel {
            prompt += CHANNEL;
            prompt += channel;
        }
        prompt += MESSAGE;
        prompt += &turn.text;
        prompt += END;
    }
    prompt += START;
    prompt += "assistant";
    Ok(prompt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// A conversation and the prompt the openai-harmony package renders for it, as vLLM maps
    /// the request (scripts/make_harmony_fixtures.py).
    #[derive(Deserialize)]
    struct Case {
        name: String,
        messages: Vec<ChatMessage>,
        reasoning_effort: Option<ReasoningEffort>,
        tools: Option<serde_json::Value>,
        rendered: String,
        conversation_start_date: String,
    }

    fn cases() -> Vec<Case> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/harmony/renders.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn prompts_match_openai_harmony() {
        let mut checked = 0;
        for case in cases().into_iter().filter(|c| c.tools.is_none()) {
            let effort = case.reasoning_effort.unwrap_or_default();
            let prompt = render(&case.messages, effort, &case.conversation_start_date).unwrap();
            assert_eq!(prompt, case.rendered, "{}", case.name);
            checked += 1;
        }
        assert_eq!(checked, 7);
    }

    #[test]
    fn tool_calls_are_refused() {
        let case = cases().into_iter().find(|c| c.tools.is_some()).unwrap();
        let err = render(&case.messages, ReasoningEffort::Medium, "2025-06-28").unwrap_err();
        assert!(format!("{err:?}").contains("tool calling is not supported"), "{err:?}");
    }
}

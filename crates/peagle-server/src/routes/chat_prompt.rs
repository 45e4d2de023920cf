//! A chat's prompt: the conversation rendered (as harmony for gpt-oss, else through the
//! model's chat template, with the offered tools and past calls as vLLM passes them) and
//! tokenized, for `/v1/chat/completions` and `/tokenize`; and the answer's role and echo.

use super::off_runtime;
use crate::error::ApiError;
use crate::harmony;
use crate::protocol::chat::{ChatMessage, ChatRender, TOOLS_NEED_A_PARSER};
use crate::state::AppState;
use crate::thinking::PromptThinking;
use serde_json::{json, Value};
use std::sync::Arc;

/// The conversation's token ids through the model's chat template, rendered and tokenized
/// off the async workers, and where the prompt leaves the thinking; a text too long in bytes
/// to make fewer than `limit` tokens is refused before it is tokenized, naming `field`. The
/// rendered template holds the special tokens it wants (BOS included), so the tokenizer adds
/// its own only when `add_special_tokens` asks.
pub async fn prompt_ids(
    state: &Arc<AppState>,
    messages: Vec<ChatMessage>,
    render: ChatRender,
    add_special_tokens: Option<bool>,
    limit: usize,
    field: &'static str,
) -> Result<(Vec<u32>, PromptThinking), ApiError> {
    let state = state.clone();
    off_runtime(move || {
        let (text, thinking) = prompt_text(&state, &messages, &render)?;
        let ids = state
            .model
            .encode(&text, add_special_tokens.unwrap_or(false), limit, field)?;
        Ok((ids, thinking))
    })
    .await
}

/// The conversation as prompt text: harmony for a gpt-oss model, else the model's chat
/// template, which gets the offered tools as `tools` and past calls and results where the
/// server parses tool calls (`template_message`); and where the prompt leaves the thinking.
fn prompt_text(
    state: &AppState,
    messages: &[ChatMessage],
    render: &ChatRender,
) -> Result<(String, PromptThinking), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "messages is empty"));
    }
    if state.model.harmony.is_some() {
        if render.continue_final_message || !render.add_generation_prompt {
            return Err(ApiError::invalid(
                Some("add_generation_prompt"),
                "harmony (gpt-oss) chats always open a new assistant turn: continue_final_message and \
                 add_generation_prompt false are not supported",
            ));
        }
        let effort = render.reasoning_effort.unwrap_or_default();
        let text = harmony::render(messages, effort, &harmony::today(), &render.tools)?;
        return Ok((text, PromptThinking::Neither));
    }
    // A forced call needs no parser: its answer is read as calls (`forced_calls`).
    let tool_calling = state.model.tool_call_parser.is_some() || render.tool_choice.forces();
    if !render.tools.is_empty() && !tool_calling {
        return Err(ApiError::invalid(
            Some("tools"),
            format!("tools: {TOOLS_NEED_A_PARSER}"),
        ));
    }
    let template = state.model.chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid(
            None,
            "this model has no chat template (tokenizer_config.json chat_template); use /v1/completions",
        )
    })?;
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| template_message(m, i, tool_calling))
        .collect::<Result<Vec<Value>, ApiError>>()?;
    let mut extra = render.template_kwargs.clone();
    if !render.tools.is_empty() {
        let tools: Vec<Value> = render
            .tools
            .iter()
            .map(|f| json!({"type": "function", "function": f}))
            .collect();
        extra.insert("tools".into(), Value::Array(tools));
    }
    if let Some(effort) = render.reasoning_effort {
        extra.entry("reasoning_effort").or_insert(effort.as_str().into());
    }
    let failed = |e: minijinja::Error| ApiError::invalid(Some("messages"), format!("chat template: {e}"));
    if render.continue_final_message || !render.add_generation_prompt {
        let text = match render.continue_final_message {
            true => template.render_continuing(&messages, &extra),
            false => template.render(&messages, false, &extra),
        };
        return Ok((text.map_err(failed)?, PromptThinking::Neither));
    }
    let text = template.render(&messages, true, &extra).map_err(failed)?;
    // The generation prompt alone (what rendering it adds) says where the thinking is left,
    // never the conversation's own text.
    let thinking = match state.model.reasoning_parser {
        Some(_) => {
            let without = template.render(&messages, false, &extra).map_err(failed)?;
            text.strip_prefix(without.as_str())
                .map_or(PromptThinking::Neither, PromptThinking::of)
        }
        None => PromptThinking::Neither,
    };
    Ok((text, thinking))
}

/// Message `i` as a chat template reads it: role, content and an assistant's reasoning (as
/// `reasoning_content` and `reasoning`), and where the server parses tool calls
/// (`tool_calling`), an assistant's calls with their arguments as JSON values and a tool
/// result's call id, as vLLM gives them; elsewhere those are refused.
fn template_message(m: &ChatMessage, i: usize, tool_calling: bool) -> Result<Value, ApiError> {
    let mut message = json!({"role": m.role, "content": m.text(i, "\n")?});
    if let Some(reasoning) = m.reasoning_content.as_ref().filter(|_| m.role == "assistant") {
        message["reasoning_content"] = json!(reasoning);
        message["reasoning"] = json!(reasoning);
    }
    if !tool_calling {
        m.refuse_tool_calling(i)?;
        return Ok(message);
    }
    let calls = m.tool_calls.as_deref().unwrap_or_default();
    if !calls.is_empty() {
        let calls = calls
            .iter()
            .enumerate()
            .map(|(j, call)| {
                call.check(i, j)?;
                let arguments = call.arguments_json(i, j)?;
                Ok(json!({"id": call.id, "type": "function",
                          "function": {"name": call.function.name, "arguments": arguments}}))
            })
            .collect::<Result<Vec<Value>, ApiError>>()?;
        message["tool_calls"] = Value::Array(calls);
    }
    if let Some(id) = &m.tool_call_id {
        message["tool_call_id"] = json!(id);
    }
    Ok(message)
}

/// The answer's role: the assistant's for a new turn, else (continuing or not) the final
/// message's, as vLLM names it.
pub fn answer_role(messages: &[ChatMessage], render: &ChatRender) -> String {
    match (render.add_generation_prompt, messages.last()) {
        (false, Some(last)) => last.role.clone(),
        _ => "assistant".into(),
    }
}

/// What `echo` starts the answer with: the final message's text when it has the answer's
/// role (vLLM's rule), else nothing.
pub fn echoed(messages: &[ChatMessage], role: &str) -> Result<String, ApiError> {
    let Some(last) = messages.last().filter(|m| m.role == role) else {
        return Ok(String::new());
    };
    Ok(last.text(messages.len() - 1, "\n")?.unwrap_or_default())
}

//! `POST /v1/chat/completions`: the request with its messages, the `chat.completion` response
//! and the `chat.completion.chunk` stream chunks.

use super::tools::{offered_tools, DeltaToolCall, FunctionDefinition, Tool, ToolCall, ToolChoice};
use super::{PromptLogprob, PromptPosition, StopReason, StreamOptions, TokenLogprob, Usage};
use crate::chat_template::JsonMap;
use crate::error::ApiError;
use crate::harmony::ReasoningEffort;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[schema(minimum = 1)]
    pub max_tokens: Option<i64>,
    /// The newer spelling of `max_tokens`; wins when both are given.
    #[schema(minimum = 1)]
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// vLLM extension: end the prompt with the assistant's turn header (default true).
    pub add_generation_prompt: Option<bool>,
    /// vLLM extension: leave the final message open, for the model to continue it.
    pub continue_final_message: Option<bool>,
    /// vLLM extension: start the answer with the final message's content when that message
    /// has the answer's role.
    pub echo: Option<bool>,
    /// vLLM extension: more variables for the chat template (`enable_thinking`, say).
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<JsonMap>,
    /// vLLM extension: a template sent with the request; refused, as vLLM refuses it unless
    /// told to trust requests' templates.
    pub chat_template: Option<serde_json::Value>,
    /// vLLM extension: let the tokenizer add its special tokens (a BOS) to the rendered text.
    pub add_special_tokens: Option<bool>,
    /// low, medium or high: how long a reasoning model thinks (harmony's system message;
    /// other models' chat templates get it as a variable).
    pub reasoning_effort: Option<String>,
    /// Function tools the model may call: a harmony (gpt-oss) model's, or one whose server
    /// parses its tool calls (`--tool-call-parser`).
    pub tools: Option<Vec<Tool>>,
    /// "auto" (the default), "none", or a forced call: "required" (a call of any offered
    /// function) or {"type": "function", "function": {"name": ...}}.
    #[schema(value_type = Option<String>)]
    pub tool_choice: Option<serde_json::Value>,
    /// false keeps an answer to its first call (default true).
    pub parallel_tool_calls: Option<bool>,
}

/// How a conversation is rendered (vLLM's chat options).
#[derive(Debug, Clone)]
pub struct ChatRender {
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    pub template_kwargs: JsonMap,
    pub reasoning_effort: Option<ReasoningEffort>,
    /// The function tools offered to the model (`offered_tools`).
    pub tools: Vec<FunctionDefinition>,
    pub tool_choice: ToolChoice,
}

impl ChatRender {
    /// vLLM's defaults, its refusal to both open a new turn and continue the last one, and
    /// the tools `tool_choice` offers (`offered_tools`).
    pub fn new(
        add_generation_prompt: Option<bool>,
        continue_final_message: Option<bool>,
        template_kwargs: Option<&JsonMap>,
        reasoning_effort: Option<&str>,
        tools: Option<&[Tool]>,
        tool_choice: Option<&serde_json::Value>,
    ) -> Result<Self, ApiError> {
        let tool_choice = ToolChoice::of(tool_choice)?;
        let render = Self {
            add_generation_prompt: add_generation_prompt.unwrap_or(true),
            continue_final_message: continue_final_message.unwrap_or(false),
            template_kwargs: template_kwargs.cloned().unwrap_or_default(),
            reasoning_effort: reasoning_effort.map(ReasoningEffort::parse).transpose()?,
            tools: offered_tools(tools, &tool_choice)?,
            tool_choice,
        };
        if render.add_generation_prompt && render.continue_final_message {
            return Err(ApiError::invalid(
                Some("continue_final_message"),
                "continue_final_message needs add_generation_prompt set to false",
            ));
        }
        Ok(render)
    }
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// A past assistant turn's reasoning (vLLM also reads it as `reasoning`).
    #[serde(default, alias = "reasoning")]
    pub reasoning_content: Option<String>,
    /// A past assistant turn's tool calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// A tool message's: the id of the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// Refuses message `i` when it holds tool calls or is a tool's result, for a model whose
    /// tool calls the server does not parse: rendering the message without them would
    /// misstate the conversation.
    pub fn refuse_tool_calling(&self, i: usize) -> Result<(), ApiError> {
        let field = match (&self.tool_calls, self.role.as_str()) {
            (Some(calls), _) if !calls.is_empty() => "tool_calls",
            (_, "tool") => "role",
            _ => return Ok(()),
        };
        Err(ApiError::invalid(
            Some(&format!("messages[{i}].{field}")),
            format!("messages[{i}]: {TOOLS_NEED_A_PARSER}"),
        ))
    }

    /// The content of message `i` as one string, text parts joined by `separator`; None for
    /// null content. Other parts are refused.
    pub fn text(&self, i: usize, separator: &str) -> Result<Option<String>, ApiError> {
        match &self.content {
            None => Ok(None),
            Some(MessageContent::Text(text)) => Ok(Some(text.clone())),
            Some(MessageContent::Parts(parts)) => {
                let texts = parts
                    .iter()
                    .map(|p| match (p.kind.as_str(), &p.text) {
                        ("text", Some(text)) => Ok(text.as_str()),
                        _ => Err(ApiError::invalid(
                            Some(&format!("messages[{i}].content")),
                            format!(
                                "unsupported content part of type {:?}: only text parts are supported",
                                p.kind
                            ),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Some(texts.join(separator)))
            }
        }
    }
}

/// Message content: a string, or a list of parts of which only text parts are supported.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged, expecting = "a string or a list of content parts")]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatResponse {
    pub id: String,
    /// "chat.completion", or "chat.completion.chunk" for stream chunks.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// vLLM extension: the prompt's tokens scored, when asked for (`prompt_logprobs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Option<HashMap<String, PromptLogprob>>>>)]
    pub prompt_logprobs: Option<Vec<Option<PromptPosition>>>,
}

/// One choice: `message` in a response, `delta` in a stream chunk.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatChoice {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<Delta>,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// vLLM extension: the stop string or stop token id that ended the choice.
    pub stop_reason: Option<StopReason>,
}

/// Why a model without a tool call parser refuses tools.
pub const TOOLS_NEED_A_PARSER: &str = "tool calling needs a harmony (gpt-oss) model, a server started with \
     --tool-call-parser hermes or llama3_json for a model whose chat template offers tools, or a tool_choice \
     that forces a call";

#[derive(Debug, Serialize, ToSchema)]
pub struct Message {
    pub role: String,
    /// The answer's text; null for one that was only reasoning or tool calls.
    pub content: Option<String>,
    /// A reasoning model's thinking (harmony's `analysis` channel, or `<think>` where the
    /// server has a reasoning parser), as vLLM returns it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<DeltaToolCall>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatTokenLogprob {
    pub token: String,
    #[serde(serialize_with = "super::short_f32::option")]
    pub logprob: Option<f32>,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    #[serde(serialize_with = "super::short_f32::serialize")]
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl ChatLogprobs {
    pub fn new(tokens: &[TokenLogprob]) -> Self {
        Self {
            content: tokens.iter().map(ChatTokenLogprob::new).collect(),
        }
    }
}

impl ChatTokenLogprob {
    /// A token's entry as chat completions and the Responses API show it.
    pub fn new(t: &TokenLogprob) -> Self {
        Self {
            token: t.token.clone(),
            logprob: t.logprob,
            bytes: t.token.as_bytes().to_vec(),
            top_logprobs: t
                .top
                .iter()
                .map(|(token, logprob)| TopLogprob {
                    token: token.clone(),
                    logprob: *logprob,
                    bytes: token.as_bytes().to_vec(),
                })
                .collect(),
        }
    }
}

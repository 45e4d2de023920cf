//! `POST /v1/responses`: OpenAI's Responses API. The request with its input items, the
//! `response` object with its output items, and the usage.

use super::chat::ChatTokenLogprob;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
pub struct ResponsesRequest {
    pub model: Option<String>,
    /// The conversation: a user message's text, or its items in order.
    pub input: ResponsesInput,
    /// A system (for gpt-oss, developer) message before the input.
    pub instructions: Option<String>,
    /// The most tokens the answer may take, reasoning included.
    #[schema(minimum = 1)]
    pub max_output_tokens: Option<i64>,
    pub stream: Option<bool>,
    /// Function tools (`{"type": "function", "name", "description", "parameters"}`), the only
    /// kind this server runs.
    pub tools: Option<Vec<ResponsesTool>>,
    /// "auto" (the default), "none", "required", or `{"type": "function", "name": ...}`.
    pub tool_choice: Option<Value>,
    /// false keeps an answer to its first call (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `format`: `{"type": "text"}` (the default), `{"type": "json_object"}`, or
    /// `{"type": "json_schema", "name", "schema"}`, which holds the answer's text to it.
    pub text: Option<TextConfig>,
    /// `effort`: low, medium or high.
    pub reasoning: Option<ReasoningConfig>,
    /// Keep the response, with its conversation, for `previous_response_id` and
    /// `/v1/responses/{id}` (default true; nothing is kept where the server keeps none).
    pub store: Option<bool>,
    /// A stored response to go on from: its conversation, through its answer, comes before
    /// `input` (its instructions do not).
    pub previous_response_id: Option<String>,
    /// Refused: conversations are not kept (`previous_response_id` is).
    #[schema(value_type = Option<Object>)]
    pub conversation: Option<Value>,
    /// `message.output_text.logprobs` gives each output text's tokens' log-probabilities;
    /// `reasoning.encrypted_content` is accepted (none is written); anything else is refused.
    pub include: Option<Vec<String>>,
    /// How many most likely alternatives each logprobs entry lists, where `include` asks for
    /// them (accepted and unused otherwise, as in vLLM).
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<i64>,
    /// Answer in the background: the request returns the response queued, to be read by
    /// `GET /v1/responses/{id}` (or followed as a stream, from any sequence number) and
    /// cancelled by `POST /v1/responses/{id}/cancel`. It needs the response stored.
    pub background: Option<bool>,
    /// Returned as given.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// "disabled" (the default); "auto" is refused: an input too long for the context is a 400.
    pub truncation: Option<String>,
    pub user: Option<String>,
}

/// A user message's text, or a list of items.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged, expecting = "a string or a list of input items")]
pub enum ResponsesInput {
    Text(String),
    Items(Vec<InputItem>),
}

/// One input item, read by its `type`: `message` (the default where a `role` is given),
/// `function_call`, `function_call_output` or `reasoning`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct InputItem {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The item's id, as `/v1/responses/{id}/input_items` lists it; one is made where none
    /// is given.
    pub id: Option<String>,
    /// A message's: user, system, developer or assistant.
    pub role: Option<String>,
    /// A message's text, or its text parts (`input_text`, `output_text`).
    pub content: Option<ItemContent>,
    /// A function call's and its output's: the id that pairs them.
    pub call_id: Option<String>,
    /// A function call's function.
    pub name: Option<String>,
    /// A function call's arguments, as JSON text.
    pub arguments: Option<String>,
    /// A function call output's result.
    pub output: Option<ItemContent>,
    /// A reasoning item's summary, read where it has no `content`.
    pub summary: Option<Vec<ItemPart>>,
}

/// Text, or a list of parts of which only text parts are read.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged, expecting = "a string or a list of content parts")]
pub enum ItemContent {
    Text(String),
    Parts(Vec<ItemPart>),
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ItemPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// A function tool, as the Responses API spells it: flat, without chat's `function` object.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ResponsesTool {
    #[serde(rename = "type")]
    pub kind: String,
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema object.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
pub struct TextConfig {
    #[schema(value_type = Option<Object>)]
    pub format: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
pub struct ReasoningConfig {
    pub effort: Option<String>,
    /// Accepted; no summary is written (the reasoning comes whole, as `content`).
    pub summary: Option<String>,
}

/// The `response` object: the answer's items, and the request's settings as it was served.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseObject {
    pub id: String,
    /// "response".
    pub object: &'static str,
    pub created_at: u64,
    /// Whether the response runs in the background (`background: true`).
    pub background: bool,
    /// queued (a background response just made), in_progress (in a stream's first events,
    /// and a background response's while it runs), completed, incomplete (cut by
    /// `max_output_tokens` or the context), failed, or cancelled (a background response, by
    /// `POST /v1/responses/{id}/cancel`).
    pub status: &'static str,
    pub completed_at: Option<u64>,
    /// Set where the status is failed: the server ended the answer early (stopping, or its
    /// engine failed). Other failures are error responses, or an `error` event in a stream.
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Option<ReasoningConfig>,
    /// Whether the response is kept (`GET /v1/responses/{id}`).
    pub store: bool,
    pub temperature: Option<f32>,
    pub text: TextConfig,
    pub tool_choice: Value,
    pub tools: Vec<ResponsesTool>,
    /// The alternatives each logprobs entry lists, as asked for (0 where not).
    pub top_logprobs: i64,
    pub top_p: Option<f32>,
    /// "disabled".
    pub truncation: &'static str,
    pub usage: Option<ResponseUsage>,
    pub user: Option<String>,
}

/// What `DELETE /v1/responses/{id}` answers.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeletedResponse {
    pub id: String,
    /// "response.deleted".
    pub object: &'static str,
    pub deleted: bool,
}

/// What `GET /v1/responses/{id}/input_items` answers: a page of the response's input items.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InputItemList {
    /// "list".
    pub object: &'static str,
    /// Messages (`input_text` parts; `output_text` for an assistant's), `function_call`,
    /// `function_call_output` and `reasoning` items, each with its id.
    #[schema(value_type = Vec<Object>)]
    pub data: Vec<Value>,
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    /// Whether more items lie beyond the page: after it in its order, or before it when the
    /// page was asked for with `before` alone (the items nearest that cursor).
    pub has_more: bool,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseError {
    /// "server_error".
    pub code: &'static str,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IncompleteDetails {
    /// "max_output_tokens".
    pub reason: &'static str,
}

/// An output item: reasoning, a message, or a function call.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum OutputItem {
    Reasoning(ReasoningItem),
    Message(MessageItem),
    FunctionCall(FunctionCallItem),
}

/// The model's thinking (harmony's analysis channel, or `<think>` under a reasoning parser).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReasoningItem {
    /// "reasoning".
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: String,
    /// Always empty: no summary is written.
    pub summary: Vec<ReasoningText>,
    pub content: Vec<ReasoningText>,
    pub status: &'static str,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReasoningText {
    /// "reasoning_text".
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MessageItem {
    /// "message".
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: String,
    /// "assistant".
    pub role: &'static str,
    pub status: &'static str,
    pub content: Vec<OutputText>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputText {
    /// "output_text".
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    /// Always empty.
    #[schema(value_type = Vec<Object>)]
    pub annotations: Vec<Value>,
    /// The text's tokens' log-probabilities, where `include` asks for
    /// `message.output_text.logprobs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<ChatTokenLogprob>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FunctionCallItem {
    /// "function_call".
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: String,
    /// What the call's `function_call_output` names.
    pub call_id: String,
    pub name: String,
    /// JSON text as the model wrote it, not checked against the schema.
    pub arguments: String,
    pub status: &'static str,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: usize,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct InputTokensDetails {
    /// Input tokens found in the prefix cache.
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct OutputTokensDetails {
    /// The reasoning's tokens, as the tokenizer encodes its text.
    pub reasoning_tokens: usize,
}

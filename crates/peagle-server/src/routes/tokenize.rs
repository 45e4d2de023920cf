//! `POST /tokenize` and `POST /detokenize` (vLLM's): the served model's token ids of a prompt
//! or of chat messages as the chat route renders them, and the text of token ids. Clients use
//! them to count tokens and to find the ids `logit_bias` and `stop_token_ids` take.

use super::chat_prompt::prompt_ids;
use super::{check_model, off_runtime};
use crate::chat_template::JsonMap;
use crate::error::ApiError;
use crate::json_body::ApiJson;
use crate::openapi::ApiErrors;
use crate::params::check_token_ids;
use crate::protocol::chat::{ChatMessage, ChatRender};
use crate::protocol::tools::Tool;
use crate::state::AppState;
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    /// Default: true for a prompt, false for messages (the template holds its own).
    pub add_special_tokens: Option<bool>,
    /// For messages, as the chat route takes them.
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub chat_template_kwargs: Option<JsonMap>,
    pub reasoning_effort: Option<String>,
    /// For messages: the tools offered, counted as chat renders them.
    pub tools: Option<Vec<Tool>>,
    #[schema(value_type = Option<String>)]
    pub tool_choice: Option<serde_json::Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TokenizeResponse {
    pub count: usize,
    pub max_model_len: usize,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DetokenizeResponse {
    pub prompt: String,
}

#[utoipa::path(post, path = "/tokenize", tag = "vLLM", security(("api_key" = [])),
    request_body = TokenizeRequest,
    responses((status = 200, body = TokenizeResponse), ApiErrors))]
pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    check_model(&state, req.model.as_deref())?;
    let tokens = match (&req.prompt, &req.messages) {
        (Some(prompt), None) => {
            let (state, prompt) = (state.clone(), prompt.clone());
            let add_special = req.add_special_tokens.unwrap_or(true);
            off_runtime(move || {
                state
                    .model
                    .encode(&prompt, add_special, state.engine.max_model_len(), "prompt")
            })
            .await?
        }
        (None, Some(messages)) => {
            let render = ChatRender::new(
                req.add_generation_prompt,
                req.continue_final_message,
                req.chat_template_kwargs.as_ref(),
                req.reasoning_effort.as_deref(),
                req.tools.as_deref(),
                req.tool_choice.as_ref(),
            )?;
            prompt_ids(
                &state,
                messages.clone(),
                render,
                req.add_special_tokens,
                state.engine.max_model_len(),
                "messages",
            )
            .await?
            .0
        }
        _ => return Err(ApiError::invalid(None, "give either prompt or messages")),
    };
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.engine.max_model_len(),
        tokens,
    }))
}

#[utoipa::path(post, path = "/detokenize", tag = "vLLM", security(("api_key" = [])),
    request_body = DetokenizeRequest,
    responses((status = 200, body = DetokenizeResponse), ApiErrors))]
pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    check_model(&state, req.model.as_deref())?;
    check_token_ids(&req.tokens, state.model.vocab_size(), "tokens")?;
    Ok(Json(DetokenizeResponse {
        prompt: state.model.decode(&req.tokens)?,
    }))
}

//! `POST /v1/completions`: the request and the `text_completion` response and stream chunks.

use super::{StopReason, StreamOptions, Usage};
use crate::choice::TokenLogprob;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub max_tokens: Option<i64>,
    /// Number of most likely alternatives to report with each token's log-probability.
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Accepted only when it equals `n`: no other choices are generated to pick from.
    pub best_of: Option<i64>,
    /// Not supported: the model has no fill-in-the-middle mode.
    pub suffix: Option<String>,
}

/// `prompt`: text or token ids, one prompt or a list of them.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a string, a list of strings, a list of token ids or a list of token id lists"
)]
pub enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Serialize)]
pub struct CompletionResponse {
    pub id: String,
    /// "text_completion", for the response and its stream chunks alike.
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Serialize)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// vLLM extension: the stop string or stop token id that ended the choice.
    pub stop_reason: Option<StopReason>,
}

/// The legacy completions logprobs layout: parallel lists, one entry per token.
#[derive(Debug, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    /// The most likely alternatives at each position, plus the chosen token (as vLLM does).
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    pub fn new(tokens: &[TokenLogprob]) -> Self {
        Self {
            tokens: tokens.iter().map(|t| t.token.clone()).collect(),
            token_logprobs: tokens.iter().map(|t| t.logprob).collect(),
            top_logprobs: tokens.iter().map(top_map).collect(),
            text_offset: tokens.iter().map(|t| t.text_offset).collect(),
        }
    }
}

fn top_map(t: &TokenLogprob) -> BTreeMap<String, f32> {
    let mut map: BTreeMap<String, f32> = t.top.iter().cloned().collect();
    if let Some(lp) = t.logprob {
        map.entry(t.token.clone()).or_insert(lp);
    }
    map
}

//! `POST /v1/completions`: the request and the `text_completion` response and stream chunks.

use super::{PromptLogprob, PromptPosition, StopReason, StreamOptions, TokenLogprob, Usage};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    /// 0 only with `echo`: the prompt is scored (its logprobs, when asked for) and nothing
    /// is generated.
    #[schema(minimum = 0)]
    pub max_tokens: Option<i64>,
    /// Number of most likely alternatives to report with each token's log-probability.
    #[schema(minimum = 0, maximum = 20)]
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Accepted only when it equals `n`: no other choices are generated to pick from.
    pub best_of: Option<i64>,
    /// Not supported: the model has no fill-in-the-middle mode.
    pub suffix: Option<String>,
    /// vLLM extension: let the tokenizer add its special tokens (a BOS) to a text prompt
    /// (default true).
    pub add_special_tokens: Option<bool>,
    /// Refused unless empty: tools are offered in chat.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<serde_json::Value>,
    /// Refused unless "auto" or "none": a call can only be forced in chat.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<serde_json::Value>,
}

/// `prompt`: text or token ids, one prompt or a list of them.
#[derive(Debug, Deserialize, ToSchema)]
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

impl PromptInput {
    /// How many prompts the request holds.
    pub fn count(&self) -> usize {
        match self {
            Self::Text(_) | Self::Tokens(_) => 1,
            Self::Texts(texts) => texts.len(),
            Self::TokenLists(lists) => lists.len(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
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

#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionChoice {
    pub index: usize,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
    /// vLLM extension: the stop string or stop token id that ended the choice.
    pub stop_reason: Option<StopReason>,
    /// vLLM extension: the prompt's tokens scored, when asked for (`prompt_logprobs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Option<HashMap<String, PromptLogprob>>>>)]
    pub prompt_logprobs: Option<Vec<Option<PromptPosition>>>,
}

/// The legacy completions logprobs layout: parallel lists, one entry per token.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    /// The most likely alternatives at each position, plus the chosen token (as vLLM does);
    /// null where the token has no log-probability (a prompt's first).
    #[schema(value_type = Vec<Option<HashMap<String, f32>>>)]
    pub top_logprobs: Vec<Option<TopLogprobs>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    pub fn new(tokens: &[TokenLogprob]) -> Self {
        Self {
            tokens: tokens.iter().map(|t| t.token.clone()).collect(),
            token_logprobs: tokens.iter().map(|t| t.logprob).collect(),
            top_logprobs: tokens.iter().map(|t| t.logprob.map(|_| top_map(t))).collect(),
            text_offset: tokens.iter().map(|t| t.text_offset).collect(),
        }
    }
}

/// One position's `top_logprobs` map in vLLM's order: the chosen token, then the alternatives
/// most likely first. Clients read the first key as the chosen token or the most likely one.
/// A text that several tokens decode to appears once, first come.
#[derive(Debug)]
pub struct TopLogprobs(Vec<(String, f32)>);

fn top_map(t: &TokenLogprob) -> TopLogprobs {
    let chosen = t.logprob.map(|lp| (t.token.clone(), lp));
    let mut entries: Vec<(String, f32)> = Vec::with_capacity(t.top.len() + 1);
    for (text, lp) in chosen.into_iter().chain(t.top.iter().cloned()) {
        if !entries.iter().any(|(seen, _)| *seen == text) {
            entries.push((text, lp));
        }
    }
    TopLogprobs(entries)
}

impl Serialize for TopLogprobs {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (text, lp) in &self.0 {
            map.serialize_entry(text, lp)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_logprobs_keep_the_chosen_token_first_then_rank_order() {
        let t = TokenLogprob {
            token: "b".into(),
            logprob: Some(-2.0),
            top: vec![("z".into(), -0.5), ("a".into(), -1.0), ("b".into(), -2.0)],
            text_offset: 0,
        };
        let json = serde_json::to_string(&top_map(&t)).unwrap();
        assert_eq!(json, r#"{"b":-2.0,"z":-0.5,"a":-1.0}"#);
    }
}

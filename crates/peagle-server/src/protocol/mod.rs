//! The OpenAI wire format: request bodies as they arrive, responses and stream chunks as they
//! leave. Unknown request fields are ignored, as OpenAI-compatible servers do.

pub mod chat;
pub mod completion;
pub mod refused;
pub mod responses;
pub mod sampling;
pub mod structured;
pub mod tools;

use crate::error::ApiError;
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};
use utoipa::ToSchema;

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged, expecting = "a string or a list of strings")]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    /// The non-empty stop strings (an empty one would match everywhere).
    pub fn strings(&self) -> Vec<String> {
        let all = match self {
            Stop::One(s) => vec![s.clone()],
            Stop::Many(v) => v.clone(),
        };
        all.into_iter().filter(|s| !s.is_empty()).collect()
    }
}

/// One position of vLLM's `prompt_logprobs` (null for the prompt's first token, which nothing
/// predicts): the prompt token, then its most likely alternatives, by token id, each once.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptPosition(pub Vec<(u32, PromptLogprob)>);

/// A token's entry in a `PromptPosition`: its rank is 1 for the row's most likely token.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct PromptLogprob {
    pub logprob: f32,
    pub rank: u32,
    pub decoded_token: String,
}

/// Serializers of log-probabilities as the f64 of the f32's shortest decimal form, so that a
/// value that goes through a `serde_json::Value` first (which holds numbers as f64, as a
/// stream's events do) prints as one written directly does: -0.8730922, not
/// -0.8730921745300293.
pub mod short_f32 {
    use serde::Serializer;

    pub fn serialize<S: Serializer>(value: &f32, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(widened(*value))
    }

    pub fn option<S: Serializer>(value: &Option<f32>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => serializer.serialize_some(&widened(*value)),
            None => serializer.serialize_none(),
        }
    }

    fn widened(value: f32) -> f64 {
        value.to_string().parse().unwrap_or(f64::from(value))
    }
}

impl Serialize for PromptPosition {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (id, entry) in &self.0 {
            map.serialize_entry(&id.to_string(), entry)?;
        }
        map.end()
    }
}

/// One token's log-probability entry, as a response shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: Option<f32>,
    /// Most likely alternatives, most likely first.
    pub top: Vec<(String, f32)>,
    /// Characters of the choice's text before this token.
    pub text_offset: usize,
}

/// vLLM's `stop_reason`: the stop string or stop token id that ended a choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(untagged)]
pub enum StopReason {
    Text(String),
    Token(u32),
}

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
    /// vLLM extension: every chunk carries its choice's usage so far too.
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// Where a stream reports usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamUsage {
    /// A last chunk with the totals and no choices.
    pub at_end: bool,
    /// Each chunk with its choice's counts so far.
    pub per_chunk: bool,
}

impl StreamUsage {
    /// `stream_options` is only for streams, as OpenAI and vLLM hold.
    pub fn of(stream: bool, options: Option<&StreamOptions>) -> Result<Self, ApiError> {
        match (stream, options) {
            (false, Some(_)) => Err(ApiError::invalid(
                Some("stream_options"),
                "stream_options can only be given with stream set to true",
            )),
            (_, None) => Ok(Self::default()),
            (true, Some(o)) => Ok(Self {
                at_end: o.include_usage.unwrap_or(false),
                per_chunk: o.continuous_usage_stats.unwrap_or(false),
            }),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    /// In a response's final usage: how many prompt tokens came from the prefix cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: None,
        }
    }

    /// A finished response's usage, `cached_tokens` of its prompt tokens found cached.
    pub fn finished(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Self {
        Self {
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens }),
            ..Self::new(prompt_tokens, completion_tokens)
        }
    }
}

/// A response id such as `cmpl-3f2a...` (`prefix` holds its separator: `cmpl-`, `resp_`), or
/// `cmpl-<id>` for a client's `X-Request-Id` (as vLLM names it), so logs on both sides can be
/// matched.
pub fn response_id(prefix: &str, headers: &HeaderMap) -> String {
    match client_request_id(headers) {
        Some(id) => format!("{prefix}{id}"),
        None => format!("{prefix}{}", random_id()),
    }
}

/// The client's `X-Request-Id`, when it sent a non-empty one.
pub fn client_request_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty())
}

/// 32 random hex digits.
pub fn random_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

pub fn unix_time() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::chat::ChatTokenLogprob;
    use super::TokenLogprob;

    /// An entry prints alike written directly and through a `serde_json::Value`, with the
    /// f32's shortest digits; a logprob of -inf (a banned alternative) is null either way.
    #[test]
    fn logprobs_print_alike_directly_and_through_a_value() {
        let entry = ChatTokenLogprob::new(&TokenLogprob {
            token: "a".into(),
            logprob: Some(-0.873_092_2),
            top: vec![("a".into(), -0.873_092_2), ("b".into(), f32::NEG_INFINITY)],
            text_offset: 0,
        });
        let direct = serde_json::to_string(&entry).unwrap();
        let through_value = serde_json::to_value(&entry).unwrap().to_string();
        assert_eq!(direct, through_value);
        assert!(direct.contains(r#""logprob":-0.8730922,"#), "{direct}");
        assert!(direct.contains(r#""logprob":null"#), "{direct}");
    }
}

//! The OpenAI wire format: request bodies as they arrive, responses and stream chunks as they
//! leave. Unknown request fields are ignored, as OpenAI-compatible servers do.

pub mod chat;
pub mod completion;
pub mod refused;
pub mod sampling;

use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
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

/// vLLM's `stop_reason`: the stop string or stop token id that ended a choice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum StopReason {
    Text(String),
    Token(u32),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// A response id such as `cmpl-3f2a...`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

pub fn unix_time() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

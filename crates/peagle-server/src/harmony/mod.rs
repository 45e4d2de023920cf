//! Harmony, gpt-oss's chat format: conversations rendered as harmony messages
//! (`render`), the answer's channels parsed back out of the generated text (`parser`), and
//! the stop tokens that end an assistant turn. A model speaks harmony when its config says
//! `model_type: gpt_oss` and its tokenizer has harmony's special tokens; its chat template
//! is then not used, as vLLM does.

mod parser;
mod render;

pub use parser::{Event, Parser};
pub use render::render;

use crate::error::ApiError;
use serde::Deserialize;
use std::path::Path;
use tokenizers::Tokenizer;

/// The special tokens of harmony's message syntax.
pub const START: &str = "<|start|>";
pub const END: &str = "<|end|>";
pub const MESSAGE: &str = "<|message|>";
pub const CHANNEL: &str = "<|channel|>";
pub const CONSTRAIN: &str = "<|constrain|>";
/// Ends the assistant's final answer.
pub const RETURN: &str = "<|return|>";
/// Ends a tool call.
pub const CALL: &str = "<|call|>";
const MARKERS: [&str; 7] = [START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL];

/// A harmony answer's text split by channel as it streams: `analysis` is reasoning, every
/// other message (`final`, a `commentary` preamble) is content.
#[derive(Default)]
pub struct Channels {
    parser: Parser,
    reasoning: bool,
}

impl Channels {
    /// The reasoning and content that `text` adds; `last` flushes what the parser held back.
    pub fn split(&mut self, text: &str, last: bool) -> (String, String) {
        let mut events = self.parser.feed(text);
        if last {
            events.extend(self.parser.finish());
        }
        let (mut reasoning, mut content) = (String::new(), String::new());
        for event in events {
            match event {
                Event::Message { channel, .. } => self.reasoning = channel.as_deref() == Some("analysis"),
                Event::Text(text) if self.reasoning => reasoning += &text,
                Event::Text(text) => content += &text,
            }
        }
        (reasoning, content)
    }
}

/// A model's harmony tokens.
#[derive(Debug, Clone)]
pub struct Harmony {
    /// `<|return|>` and `<|call|>`: an assistant turn ends on either (harmony's
    /// `stop_tokens_for_assistant_actions`).
    pub stop_token_ids: Vec<u32>,
}

impl Harmony {
    /// Harmony for a gpt-oss model directory whose tokenizer has every harmony token; None
    /// for other models. A gpt-oss without them keeps to its chat template, with a warning.
    pub fn detect(dir: &Path, tokenizer: &Tokenizer) -> Option<Self> {
        #[derive(Deserialize)]
        struct ModelType {
            model_type: Option<String>,
        }
        let config = std::fs::read_to_string(dir.join("config.json")).ok()?;
        let model_type = serde_json::from_str::<ModelType>(&config).ok()?.model_type;
        if model_type.as_deref() != Some("gpt_oss") {
            return None;
        }
        if let Some(missing) = MARKERS.iter().find(|m| tokenizer.token_to_id(m).is_none()) {
            tracing::warn!(
                token = missing,
                "a gpt-oss tokenizer without harmony's tokens: using its chat template"
            );
            return None;
        }
        let id = |token| tokenizer.token_to_id(token).expect("checked above");
        Some(Self {
            stop_token_ids: vec![id(RETURN), id(CALL)],
        })
    }
}

/// How much the model reasons before answering (the request's `reasoning_effort`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    Low,
    #[default]
    Medium,
    High,
}

impl ReasoningEffort {
    pub fn parse(value: &str) -> Result<Self, ApiError> {
        match value {
            "low" => Ok(Self::Low),
            "medium" => Ok(Self::Medium),
            "high" => Ok(Self::High),
            other => Err(ApiError::invalid(
                Some("reasoning_effort"),
                format!("reasoning_effort must be low, medium or high, not {other:?}"),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }
}

/// Today's date in UTC as YYYY-MM-DD: the conversation start date of the system message.
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    civil_date(secs / 86_400)
}

/// The proleptic Gregorian date `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_date(days: u64) -> String {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_count_from_the_epoch() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(11_016), "2000-02-29");
        assert_eq!(civil_date(20_267), "2025-06-28");
        assert_eq!(civil_date(20_782), "2026-11-25");
    }

    #[test]
    fn reasoning_effort_is_one_of_three() {
        assert_eq!(ReasoningEffort::parse("high").unwrap(), ReasoningEffort::High);
        let err = ReasoningEffort::parse("max").unwrap_err();
        assert!(format!("{err:?}").contains("low, medium or high"), "{err:?}");
    }
}

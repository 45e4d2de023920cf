//! Harmony, gpt-oss's chat format: conversations rendered as harmony messages
//! (`render`, the offered tools' parameters by `typescript`), the answer's channels and tool
//! calls parsed back out of the generated text (`parser`), the structure of an answer forced
//! to call (`forced_call`), and the stop tokens that end an assistant turn. A model speaks harmony when its config says
//! `model_type: gpt_oss` and its tokenizer has harmony's special tokens; its chat template
//! is then not used, as vLLM does.

mod forced_call;
mod parser;
mod render;
mod typescript;

pub use parser::{Event, Parser};

use crate::answer::{CallPiece, Offer, Split};
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

/// Where the current message's text goes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Route {
    Reasoning,
    #[default]
    Content,
    Call(usize),
    /// A call past the most taken (`parallel_tool_calls: false`): dropped, but a call.
    SurplusCall,
    Dropped,
}

/// A harmony answer split as it streams, as vLLM splits it: `analysis` is reasoning; a
/// message to an offered function tool (`functions.NAME`) is a call, its text the
/// arguments; every other message to no one (`final`, a `commentary` preamble, or output that
/// is not harmony at all) is content. A message to another recipient (a function not
/// offered, a built-in tool) is dropped, as vLLM drops a call it has no tool parser for.
pub struct Channels {
    parser: Parser,
    route: Route,
    calls: usize,
    offer: Offer,
}

impl Channels {
    /// A split that takes messages to offered functions for calls, as `offer` allows (the
    /// model ends its turn on a call, but `min_tokens` may hold it open).
    pub fn offering(offer: Offer) -> Self {
        Self {
            parser: Parser::default(),
            route: Route::default(),
            calls: 0,
            offer,
        }
    }

    /// Whether the answer so far ends in a call: a turn that stops there stops to call.
    pub fn ends_in_call(&self) -> bool {
        matches!(self.route, Route::Call(_) | Route::SurplusCall)
    }

    /// What `text` adds; `last` flushes what the parser held back.
    pub fn split(&mut self, text: &str, last: bool) -> Split {
        let mut whole = Split::default();
        for split in self.split_in_order(text, last) {
            whole.extend(split);
        }
        whole
    }

    /// What `text` adds, as splits of one kind each in the answer's order: an answer may go
    /// back to reasoning after a preamble, and a few tokens (a speculative step's) may end
    /// one message and begin the next.
    pub fn split_in_order(&mut self, text: &str, last: bool) -> Vec<Split> {
        let mut events = self.parser.feed(text);
        if last {
            events.extend(self.parser.finish());
        }
        let mut splits: Vec<(Route, Split)> = Vec::new();
        for event in events {
            match event {
                Event::Message { channel, recipient } => self.begin(channel, recipient, &mut splits),
                Event::Text(text) => {
                    let route = self.route;
                    match route {
                        Route::Reasoning => split_of(&mut splits, route).reasoning += &text,
                        Route::Content => split_of(&mut splits, route).content += &text,
                        Route::Call(index) => {
                            let calls = &mut split_of(&mut splits, route).calls;
                            match calls.last_mut() {
                                Some(piece) => piece.arguments += &text,
                                None => calls.push(CallPiece {
                                    index,
                                    name: None,
                                    arguments: text,
                                }),
                            }
                        }
                        Route::SurplusCall | Route::Dropped => {}
                    }
                }
            }
        }
        splits.into_iter().map(|(_, split)| split).collect()
    }

    /// Routes a new message's text; a call's begins with its name.
    fn begin(&mut self, channel: Option<String>, recipient: Option<String>, splits: &mut Vec<(Route, Split)>) {
        let Some(recipient) = recipient else {
            self.route = match channel.as_deref() {
                Some("analysis") => Route::Reasoning,
                _ => Route::Content,
            };
            return;
        };
        let offered = |name: &&str| self.offer.offers(name);
        self.route = match recipient.strip_prefix("functions.").filter(offered) {
            None => Route::Dropped,
            Some(_) if !self.offer.takes(self.calls) => Route::SurplusCall,
            Some(name) => {
                let index = self.calls;
                self.calls += 1;
                split_of(splits, Route::Call(index)).calls.push(CallPiece {
                    index,
                    name: Some(name.to_string()),
                    arguments: String::new(),
                });
                Route::Call(index)
            }
        };
    }
}

/// The split that text routed to `route` goes on: the last one while the route is its, a new
/// one where the route changed.
fn split_of(splits: &mut Vec<(Route, Split)>, route: Route) -> &mut Split {
    if splits.last().map(|(last, _)| *last) != Some(route) {
        splits.push((route, Split::default()));
    }
    &mut splits.last_mut().expect("pushed above where there was none").1
}

/// A model's harmony tokens.
#[derive(Debug, Clone)]
pub struct Harmony {
    /// `<|return|>` and `<|call|>`: an assistant turn ends on either (harmony's
    /// `stop_tokens_for_assistant_actions`).
    pub stop_token_ids: Vec<u32>,
    /// The ids of the message syntax's tokens, which a forced call's structure names.
    syntax: Syntax,
}

#[derive(Debug, Clone)]
struct Syntax {
    start: u32,
    end: u32,
    message: u32,
    channel: u32,
    constrain: u32,
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
            syntax: Syntax {
                start: id(START),
                end: id(END),
                message: id(MESSAGE),
                channel: id(CHANNEL),
                constrain: id(CONSTRAIN),
            },
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
    use crate::answer::{join_calls, split_every_way, AnswerParser};

    /// The completions of tests/fixtures/harmony/parses.json (openai-harmony's parse of each)
    /// split whole, a character at a time and in 4s, alike (`split_every_way`): analysis is
    /// reasoning, a message to `functions.NAME` a call of NAME with its text as arguments, the
    /// rest content.
    #[test]
    fn answers_split_into_reasoning_content_and_calls_however_they_stream() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/harmony/parses.json");
        let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut calls_seen = 0;
        for case in file["cases"].as_array().unwrap() {
            let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
            for m in case["messages"].as_array().unwrap() {
                let text = m["content"].as_str().unwrap();
                match (m["recipient"].as_str(), m["channel"].as_str()) {
                    (Some(to), _) => calls.push((to.strip_prefix("functions.").unwrap().to_string(), text.to_string())),
                    (None, Some("analysis")) => reasoning += text,
                    (None, _) => content += text,
                }
            }
            calls_seen += calls.len();
            let completion = case["completion"].as_str().unwrap();
            let parser = || AnswerParser::Harmony(Channels::offering(Offer::new(vec!["get_weather".into()], true)));
            let (got_reasoning, got_content, got_calls, ends_in_call) = split_every_way(parser, completion);
            assert_eq!(
                (got_reasoning, got_content, got_calls),
                (reasoning, content, calls.clone()),
                "{}",
                case["name"]
            );
            assert_eq!(ends_in_call, !calls.is_empty(), "{}", case["name"]);
        }
        assert_eq!(calls_seen, 3);
    }

    /// With `parallel_tool_calls: false`, a second call is dropped, and the answer still ends
    /// in a call.
    #[test]
    fn one_call_where_calls_are_not_parallel() {
        let call = "<|channel|>commentary to=functions.f<|message|>{}<|call|>";
        let text = format!("{call}<|start|>assistant{call}");
        let mut channels = Channels::offering(Offer::new(vec!["f".into()], false));
        let split = channels.split(&text, true);
        assert_eq!(join_calls(split.calls), [("f".to_string(), "{}".to_string())]);
        assert!(channels.ends_in_call());
    }

    /// A message to a recipient that is not an offered function tool (a built-in tool, or a
    /// function the request did not offer) is dropped, and the calls after it count from 0.
    #[test]
    fn messages_to_other_recipients_are_dropped() {
        let text = "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=browser.search \
                    <|constrain|>json<|message|>{\"q\":1}<|call|><|start|>assistant<|channel|>commentary \
                    to=functions.g<|message|>{}<|call|><|start|>assistant<|channel|>commentary \
                    to=functions.f<|message|>{}<|call|>";
        let split = Channels::offering(Offer::new(vec!["f".into()], true)).split(text, true);
        assert_eq!((split.reasoning.as_str(), split.content.as_str()), ("a", ""));
        let call = CallPiece {
            index: 0,
            name: Some("f".into()),
            arguments: "{}".into(),
        };
        assert_eq!(split.calls, [call]);
    }

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

//! A chat answer's text split into the parts of a response, reasoning, content and tool calls,
//! as it streams. How depends on the model's chat format (`AnswerParser`): harmony's channels
//! for gpt-oss; for a chat template's model, `<think>` reasoning where the server was given a
//! `--reasoning-parser` and calls where it was given a `--tool-call-parser` (`<tool_call>`
//! blocks for `hermes`, JSON objects for `llama3_json`), the rest content.

use crate::forced_calls::ForcedCalls;
use crate::harmony::Channels;
use crate::hermes::Hermes;
use crate::llama3_json::Llama3Json;
use crate::thinking::Thinking;

/// What a piece of an answer adds to each part of the response.
#[derive(Debug, Default, PartialEq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
    /// Pieces of calls in order: a call's first piece names its function.
    pub calls: Vec<CallPiece>,
}

/// A piece of the answer's tool call `index` (counted from 0 over the answer).
#[derive(Debug, PartialEq)]
pub struct CallPiece {
    pub index: usize,
    /// The function, in the call's first piece.
    pub name: Option<String>,
    pub arguments: String,
}

/// Calls whole, (name, arguments), from their pieces in order: a split's, or those of a
/// stream's splits in turn.
pub fn join_calls(pieces: impl IntoIterator<Item = CallPiece>) -> Vec<(String, String)> {
    let mut calls: Vec<(String, String)> = Vec::new();
    for piece in pieces {
        match (piece.name, calls.get_mut(piece.index)) {
            (Some(name), _) => calls.push((name, piece.arguments)),
            (None, Some((_, arguments))) => *arguments += &piece.arguments,
            // A parser names a call in its first piece, so every later one finds it.
            (None, None) => {}
        }
    }
    calls
}

/// How one choice's answer is split.
pub enum AnswerParser {
    Harmony(Channels),
    /// A chat template's model: reasoning split off first where the server has a reasoning
    /// parser, then calls where it has a tool call parser; the rest is content.
    Template {
        thinking: Option<Thinking>,
        calls: Option<CallParser>,
    },
}

/// A chat template's model's tool call parser, or the calls a request forces.
pub enum CallParser {
    Hermes(Hermes),
    Llama3Json(Llama3Json),
    Forced(ForcedCalls),
}

impl CallParser {
    fn split(&mut self, text: &str, last: bool) -> Split {
        match self {
            Self::Hermes(hermes) => hermes.split(text, last),
            Self::Llama3Json(llama) => llama.split(text, last),
            Self::Forced(forced) => forced.split(text, last),
        }
    }

    fn ends_in_call(&self) -> bool {
        match self {
            Self::Hermes(hermes) => hermes.ends_in_call(),
            Self::Llama3Json(llama) => llama.ends_in_call(),
            Self::Forced(_) => false,
        }
    }
}

/// The function tools a request offers, by name, and how many calls an answer may make of
/// them: one where the request does not allow parallel calls (`parallel_tool_calls: false`),
/// as vLLM keeps only the first.
#[derive(Debug, Clone)]
pub struct Offer {
    tools: Vec<String>,
    most_calls: usize,
}

impl Offer {
    pub fn new(tools: Vec<String>, parallel: bool) -> Self {
        Self {
            tools,
            most_calls: if parallel { usize::MAX } else { 1 },
        }
    }

    pub fn offers(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t == name)
    }

    /// Whether an answer that has made `calls` takes another.
    pub fn takes(&self, calls: usize) -> bool {
        calls < self.most_calls
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

/// The length of the longest tail of `text` that is a proper start of `marker` (ASCII): what
/// a streaming parser holds back until the next piece says whether the marker follows.
pub fn partial_marker_len(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

impl Split {
    /// All content.
    pub fn content(text: String) -> Self {
        Self {
            content: text,
            ..Self::default()
        }
    }

    /// Adds what `later`, the split of the text after this one's, holds.
    pub fn extend(&mut self, later: Split) {
        self.reasoning += &later.reasoning;
        self.content += &later.content;
        self.calls.extend(later.calls);
    }
}

impl AnswerParser {
    /// What `text`, the answer's next piece, adds; `last` flushes what was held back.
    pub fn split(&mut self, text: &str, last: bool) -> Split {
        let (thinking, calls) = match self {
            Self::Harmony(channels) => return channels.split(text, last),
            Self::Template { thinking, calls } => (thinking, calls),
        };
        let (reasoning, rest) = match thinking {
            Some(thinking) => thinking.split(text, last),
            None => (String::new(), text.to_string()),
        };
        let split = match calls {
            Some(calls) => calls.split(&rest, last),
            None => Split::content(rest),
        };
        Split { reasoning, ..split }
    }

    /// What `text` adds, as splits in the answer's order, each of whose parts come in the
    /// order reasoning, content, calls (`OutputItems::push`'s): a template's parsers give
    /// their parts in that order, and harmony's messages may come in any.
    pub fn split_in_order(&mut self, text: &str, last: bool) -> Vec<Split> {
        match self {
            Self::Harmony(channels) => channels.split_in_order(text, last),
            Self::Template { .. } => vec![self.split(text, last)],
        }
    }

    /// Whether the answer so far ends in a call: a turn that stops there stops to call.
    pub fn ends_in_call(&self) -> bool {
        match self {
            Self::Harmony(channels) => channels.ends_in_call(),
            Self::Template { calls, .. } => calls.as_ref().is_some_and(CallParser::ends_in_call),
        }
    }
}

/// `text` cut into pieces of `size` characters, as a stream might bring it; an empty text is
/// one empty piece, as an answer's last update may be (tests).
#[cfg(test)]
pub fn pieces(text: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    match chars.is_empty() {
        true => vec![String::new()],
        false => chars.chunks(size.max(1)).map(|c| c.iter().collect()).collect(),
    }
}

/// `text` split by parsers from `make` a character at a time, in 4s and whole, checked to be
/// the same every way: (reasoning, content, calls, whether it ends in a call) (tests).
#[cfg(test)]
pub fn split_every_way(make: impl Fn() -> AnswerParser, text: &str) -> (String, String, Vec<(String, String)>, bool) {
    let mut results = Vec::new();
    for size in [1, 4, text.len()] {
        let mut parser = make();
        let pieces = pieces(text, size);
        let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
        for (i, piece) in pieces.iter().enumerate() {
            let split = parser.split(piece, i + 1 == pieces.len());
            reasoning += &split.reasoning;
            content += &split.content;
            calls.extend(split.calls);
        }
        results.push((reasoning, content, join_calls(calls), parser.ends_in_call()));
    }
    assert!(results.windows(2).all(|w| w[0] == w[1]), "{text:?}: {results:?}");
    results.remove(0)
}

/// `text` split every way (`split_every_way`) by a template model's parser with no reasoning
/// parser and the call parser `calls` makes of the offer of `tools`: (content, calls, whether
/// it ends in a call) (tests).
#[cfg(test)]
pub fn split_calls_every_way(
    calls: impl Fn(Offer) -> CallParser,
    tools: &[&str],
    parallel: bool,
    text: &str,
) -> (String, Vec<(String, String)>, bool) {
    let tools: Vec<String> = tools.iter().map(|t| t.to_string()).collect();
    let make = || AnswerParser::Template {
        thinking: None,
        calls: Some(calls(Offer::new(tools.clone(), parallel))),
    };
    let (reasoning, content, calls, ends_in_call) = split_every_way(make, text);
    assert!(reasoning.is_empty());
    (content, calls, ends_in_call)
}

/// A call of `name` with `arguments`, as the parsers' tests expect them.
#[cfg(test)]
pub fn call(name: &str, arguments: &str) -> (String, String) {
    (name.to_string(), arguments.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::thinking::{PromptThinking, ReasoningParser};
    use rand::rngs::StdRng;
    use rand::seq::IndexedRandom;
    use rand::{Rng, SeedableRng};

    /// Random runs of reasoning tags, call blocks and JSON calls (whole, cut or malformed),
    /// with text between: every template parser, with and without a reasoning parser, splits
    /// them alike a character at a time, in 4s and whole (`split_every_way`).
    #[test]
    fn random_answers_split_alike_however_they_stream() {
        let pieces = [
            "<think>",
            "</think>",
            "<tool_call>",
            "</tool_call>",
            r#"{"name": "get", "arguments": {"a": 1}}"#,
            r#"{"name": "other", "parameters": {}}"#,
            r#"{"name": "get", "#,
            "{",
            "}",
            "\"",
            "; ",
            "hello",
            "\n",
            " ",
            "<",
            "</",
            "é",
        ];
        let mut r = StdRng::seed_from_u64(20261203);
        for _ in 0..1500 {
            let text: String = (0..r.random_range(0..12))
                .map(|_| *pieces.choose(&mut r).unwrap())
                .collect();
            let parallel = r.random_bool(0.5);
            let thinking = [
                None,
                Some((ReasoningParser::Qwen3, PromptThinking::Neither)),
                Some((ReasoningParser::Qwen3, PromptThinking::Open)),
                Some((ReasoningParser::DeepseekR1, PromptThinking::Neither)),
            ][r.random_range(0..4)];
            let calls = r.random_range(0..3);
            let make = || AnswerParser::Template {
                thinking: thinking.map(|(parser, prompt)| Thinking::new(parser, prompt)),
                calls: {
                    let offer = Offer::new(vec!["get".into()], parallel);
                    match calls {
                        0 => None,
                        1 => Some(CallParser::Hermes(Hermes::offering(offer))),
                        _ => Some(CallParser::Llama3Json(Llama3Json::offering(offer))),
                    }
                },
            };
            split_every_way(make, &text);
        }
    }
}

//! A chat answer's text split into the parts of a response, reasoning, content and tool calls,
//! as it streams. How depends on the model's chat format (`AnswerParser`): harmony's channels
//! for gpt-oss, `<tool_call>` blocks for a model served with `--tool-call-parser hermes`, or
//! all content.

use crate::harmony::Channels;
use crate::hermes::Hermes;

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
    /// All content: a chat template's model without a tool call parser.
    Plain,
    Harmony(Channels),
    Hermes(Hermes),
}

impl AnswerParser {
    /// What `text`, the answer's next piece, adds; `last` flushes what was held back.
    pub fn split(&mut self, text: &str, last: bool) -> Split {
        match self {
            Self::Plain => Split {
                content: text.to_string(),
                ..Split::default()
            },
            Self::Harmony(channels) => channels.split(text, last),
            Self::Hermes(hermes) => hermes.split(text, last),
        }
    }

    /// Whether the answer so far ends in a call: a turn that stops there stops to call.
    pub fn ends_in_call(&self) -> bool {
        match self {
            Self::Plain => false,
            Self::Harmony(channels) => channels.in_call(),
            Self::Hermes(hermes) => hermes.ends_in_call(),
        }
    }
}

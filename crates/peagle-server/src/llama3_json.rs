//! Tool calls of Llama 3.1 and later (vLLM's `llama3_json` tool call parser): the chat
//! template offers the tools, and an answer that calls them is one or more JSON objects
//! `{"name": NAME, "parameters": {...}}` (or `"arguments"`), separated by `;`, after the
//! special `<|python_tag|>` where the model writes one (left out of the text, or kept).
//!
//! As vLLM's streaming parser has it, an answer that begins with neither `{` nor
//! `<|python_tag|>` is content. One that does is calls if the whole of it parses to calls of
//! offered functions, and content otherwise (vLLM's whole-answer parser also takes JSON from
//! the middle of prose, and calls of functions not offered; streamed and whole answers agree
//! here). So an answer's first character says which it may be, and a streamed one that may
//! be calls is held until its end.

use crate::answer::{CallPiece, Offer, Split};
use serde_json::Value;

const PYTHON_TAG: &str = "<|python_tag|>";

/// What the answer is, as far as it has come.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Nothing but whitespace yet.
    Unknown,
    Content,
    /// It may be calls: held to its end.
    MaybeCalls,
}

pub struct Llama3Json {
    offer: Offer,
    kind: Kind,
    held: String,
    calls: usize,
}

impl Llama3Json {
    /// A parser that takes calls as `offer` allows.
    pub fn offering(offer: Offer) -> Self {
        Self {
            offer,
            kind: Kind::Unknown,
            held: String::new(),
            calls: 0,
        }
    }

    /// What `text` adds; `last` gives out what was held back.
    pub fn split(&mut self, text: &str, last: bool) -> Split {
        self.held += text;
        if self.kind == Kind::Unknown {
            let start = self.held.trim_start();
            // Nothing yet, or what may begin the tag: the next piece says.
            if PYTHON_TAG.starts_with(start) && start.len() < PYTHON_TAG.len() && !last {
                return Split::default();
            }
            let calls = start.starts_with('{') || start.starts_with(PYTHON_TAG);
            self.kind = if calls { Kind::MaybeCalls } else { Kind::Content };
        }
        match (self.kind, last) {
            (Kind::MaybeCalls, false) => Split::default(),
            (Kind::MaybeCalls, true) => {
                let held = std::mem::take(&mut self.held);
                match self.parse(&held) {
                    Some(calls) => self.take(calls),
                    None => Split::content(held),
                }
            }
            _ => Split::content(std::mem::take(&mut self.held)),
        }
    }

    /// Whether the answer, split to its end, made a call.
    pub fn ends_in_call(&self) -> bool {
        self.calls > 0
    }

    /// The calls, (name, arguments as compact JSON), the whole answer holds; None where it
    /// is not calls of offered functions alone.
    fn parse(&self, answer: &str) -> Option<Vec<(String, String)>> {
        let text = answer.trim_start();
        let mut rest = text.strip_prefix(PYTHON_TAG).unwrap_or(text);
        let mut calls = Vec::new();
        loop {
            rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
            if rest.is_empty() {
                return (!calls.is_empty()).then_some(calls);
            }
            let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            let call = values.next()?.ok()?;
            rest = &rest[values.byte_offset()..];
            let name = call.get("name")?.as_str()?;
            let arguments = call.get("arguments").or_else(|| call.get("parameters"))?;
            if !self.offer.offers(name) {
                return None;
            }
            calls.push((name.to_string(), arguments.to_string()));
        }
    }

    fn take(&mut self, calls: Vec<(String, String)>) -> Split {
        let taken = calls
            .into_iter()
            .enumerate()
            .take_while(|(index, _)| self.offer.takes(*index));
        let calls: Vec<CallPiece> = taken
            .map(|(index, (name, arguments))| CallPiece {
                index,
                name: Some(name),
                arguments,
            })
            .collect();
        self.calls = calls.len();
        Split {
            calls,
            ..Split::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::{call, split_calls_every_way, CallParser};

    /// (content, calls, whether it made one) of `text`, split every way alike.
    fn parse(text: &str, tools: &[&str], parallel: bool) -> (String, Vec<(String, String)>, bool) {
        split_calls_every_way(
            |offer| CallParser::Llama3Json(Llama3Json::offering(offer)),
            tools,
            parallel,
            text,
        )
    }

    #[test]
    fn an_answer_of_json_objects_is_calls() {
        let text = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo ✓\"}}; \
                    {\"name\": \"now\", \"arguments\": {}}";
        let both = vec![call("get_weather", "{\"city\":\"Oslo ✓\"}"), call("now", "{}")];
        assert_eq!(parse(text, &["get_weather", "now"], true), (String::new(), both, true));
        let tagged = format!("<|python_tag|>{text}");
        let first = vec![call("get_weather", "{\"city\":\"Oslo ✓\"}")];
        assert_eq!(
            parse(&tagged, &["get_weather", "now"], false),
            (String::new(), first, true)
        );
    }

    /// Anything else is content: prose, a JSON object that is no call of an offered function,
    /// calls followed by prose, or calls cut off.
    #[test]
    fn anything_else_is_content() {
        for text in [
            "It is sunny.",
            " The JSON {\"name\": \"now\", \"parameters\": {}} is a call.",
            "{\"name\": \"rm\", \"parameters\": {}}",
            "{\"city\": \"Oslo\"}",
            "{\"name\": \"now\", \"parameters\": {}} and more",
            "{\"name\": \"now\", \"param",
            "",
        ] {
            assert_eq!(
                parse(text, &["now"], true),
                (text.to_string(), Vec::new(), false),
                "{text}"
            );
        }
    }
}

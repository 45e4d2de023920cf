//! Tool calls of Hermes-style chat models (Qwen2.5, Qwen3, Hermes 2 Pro; vLLM's `hermes`
//! tool call parser): the chat template offers the tools, and the model answers a call as
//! `<tool_call>{"name": NAME, "arguments": {...}}</tool_call>`.
//!
//! As vLLM's parser has it, the text before the first call is content and what follows a
//! call, but another call, is dropped. A block whose JSON does not parse to a name and
//! arguments, or that names a function the request did not offer, is no call: before the
//! first call it stays in the content as the model wrote it. A call cut off at the end of the
//! answer counts if its JSON is whole. Streamed, text that may begin a `<tool_call>` is held
//! back, and a call is given whole once it closes. With `parallel_tool_calls: false` only the
//! first call is taken, as vLLM keeps only the first.

use crate::answer::{partial_marker_len, CallPiece, Offer, Split};
use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

pub struct Hermes {
    offer: Offer,
    /// Text not yet given out: a tail that may begin the marker looked for, or an open call.
    held: String,
    in_call: bool,
    /// Calls made: once there is one, what is not a call is dropped.
    calls: usize,
}

impl Hermes {
    /// A parser that takes calls as `offer` allows.
    pub fn offering(offer: Offer) -> Self {
        Self {
            offer,
            held: String::new(),
            in_call: false,
            calls: 0,
        }
    }

    /// What `text` adds; `last` gives out what was held back.
    pub fn split(&mut self, text: &str, last: bool) -> Split {
        self.held += text;
        let mut split = Split::default();
        loop {
            let marker = if self.in_call { CLOSE } else { OPEN };
            if let Some(at) = self.held.find(marker) {
                let before = self.held[..at].to_string();
                self.held.drain(..at + marker.len());
                match self.in_call {
                    true => self.call(&before, true, &mut split),
                    false => self.text(&before, &mut split),
                }
                self.in_call = !self.in_call;
                continue;
            }
            if last {
                let rest = std::mem::take(&mut self.held);
                match self.in_call {
                    true => self.call(&rest, false, &mut split),
                    false => self.text(&rest, &mut split),
                }
                self.in_call = false;
            } else if !self.in_call {
                let keep = partial_marker_len(&self.held, OPEN);
                let out: String = self.held.drain(..self.held.len() - keep).collect();
                self.text(&out, &mut split);
            }
            return split;
        }
    }

    /// Whether the answer, split to its end, made a call: after one, nothing else is kept.
    pub fn ends_in_call(&self) -> bool {
        self.calls > 0
    }

    /// Text that is no call: content until the first call.
    fn text(&self, text: &str, split: &mut Split) {
        if self.calls == 0 {
            split.content += text;
        }
    }

    /// A call's text, `closed` by its marker or cut off at the end.
    fn call(&mut self, body: &str, closed: bool, split: &mut Split) {
        match self.parse(body) {
            Some((name, arguments)) => {
                if self.offer.takes(self.calls) {
                    split.calls.push(CallPiece {
                        index: self.calls,
                        name: Some(name),
                        arguments,
                    });
                }
                self.calls += 1;
            }
            None => {
                let end = if closed { CLOSE } else { "" };
                self.text(&format!("{OPEN}{body}{end}"), split);
            }
        }
    }

    /// The offered function and the arguments (as compact JSON) a call's text names.
    fn parse(&self, body: &str) -> Option<(String, String)> {
        let call: Value = serde_json::from_str(body.trim()).ok()?;
        let name = call.get("name")?.as_str()?;
        let arguments = call.get("arguments")?;
        self.offer
            .offers(name)
            .then(|| (name.to_string(), arguments.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::{call, join_calls, split_calls_every_way, CallParser};

    /// (content, calls, whether it ends in a call) of `text`, split every way alike.
    fn parse(text: &str, tools: &[&str]) -> (String, Vec<(String, String)>, bool) {
        split_calls_every_way(|offer| CallParser::Hermes(Hermes::offering(offer)), tools, true, text)
    }

    #[test]
    fn calls_come_out_of_the_text_and_content_stays_before_them() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n\
                    <tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let (content, calls, ends_in_call) = parse(text, &["get_weather", "now"]);
        assert_eq!(content, "Let me look.\n");
        assert_eq!(calls, [call("get_weather", "{\"city\":\"Oslo\"}"), call("now", "{}")]);
        assert!(ends_in_call);
        let text = "Ünïcode ✓ <tool_call>{\"name\": \"now\", \"arguments\": {\"tz\": \"Oslo ✓\"}}</tool_call>";
        let (content, calls, _) = parse(text, &["now"]);
        assert_eq!(
            (content.as_str(), calls),
            ("Ünïcode ✓ ", vec![call("now", "{\"tz\":\"Oslo ✓\"}")])
        );
        // Text after a call is dropped, as vLLM's parser drops it.
        let (content, calls, _) = parse(
            "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call> done",
            &["now"],
        );
        assert_eq!((content.as_str(), calls), ("", vec![call("now", "{}")]));
    }

    #[test]
    fn text_without_calls_is_content_even_where_it_looks_like_one() {
        for text in ["Plain words.", "a < b and <tool_ca", "<tool", "x <tool_call"] {
            let (content, calls, ends_in_call) = parse(text, &["now"]);
            assert_eq!(
                (content.as_str(), calls.len(), ends_in_call),
                (text, 0, false),
                "{text}"
            );
        }
    }

    /// A block that names no offered function, or whose JSON does not say one, is content as
    /// written, and so is the text after it; one cut off counts if its JSON is whole.
    #[test]
    fn calls_that_are_not_calls_stay_text() {
        let text = "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call> Sorry, I can't.";
        assert_eq!(parse(text, &["now"]), (text.to_string(), Vec::new(), false));
        assert_eq!(parse(text, &[]), (text.to_string(), Vec::new(), false));
        for text in [
            "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"now\"}</tool_call>",
            "<tool_call>not json</tool_call>",
            "<tool_call>{\"name\": \"now\", \"argu",
        ] {
            let (content, calls, ends_in_call) = parse(text, &["now"]);
            assert_eq!(
                (content.as_str(), calls.len(), ends_in_call),
                (text, 0, false),
                "{text}"
            );
        }
        let (content, calls, ends_in_call) =
            parse("<tool_call>{\"name\": \"now\", \"arguments\": {\"a\": 1}}", &["now"]);
        assert_eq!(
            (content.as_str(), calls, ends_in_call),
            ("", vec![call("now", "{\"a\":1}")], true)
        );
        // After a call, a block that is none is dropped like any other text.
        let text = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"now\", \"argu";
        assert_eq!(parse(text, &["now"]), (String::new(), vec![call("now", "{}")], true));
    }

    /// With `parallel_tool_calls: false`, the first call is the answer's only one.
    #[test]
    fn one_call_where_calls_are_not_parallel() {
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n\
                    <tool_call>{\"name\": \"b\", \"arguments\": {}}</tool_call>";
        let mut hermes = Hermes::offering(Offer::new(vec!["a".into(), "b".into()], false));
        let split = hermes.split(text, true);
        assert_eq!(join_calls(split.calls), [call("a", "{}")]);
        assert!(hermes.ends_in_call());
    }
}

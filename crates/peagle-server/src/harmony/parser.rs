//! The assistant's harmony output, parsed as it streams. The prompt ends by opening the
//! assistant's turn, so the output starts with a message header:
//! `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`.
//! The parser reads the text with special tokens kept and reports each message's start (its
//! channel and recipient) and its text; the markers never reach the client.
//!
//! Text arrives in arbitrary pieces, so a piece that ends in what could be the start of a
//! marker keeps that tail until the next piece says what it is.

use super::{CALL, CHANNEL, CONSTRAIN, END, MARKERS, MESSAGE, RETURN, START};

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A message begins.
    Message {
        channel: Option<String>,
        /// Whom a tool call is for (`functions.NAME`).
        recipient: Option<String>,
    },
    /// Text of the current message.
    Text(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Reading a message header, up to `<|message|>`.
    Header,
    /// Reading a message's text, up to `<|end|>`, `<|return|>` or `<|call|>`.
    Content,
    /// Between messages, waiting for `<|start|>`.
    Between,
}

pub struct Parser {
    state: State,
    header: String,
    /// A trailing piece of text that may be the start of a marker.
    pending: String,
    /// Whether any marker came: until one does, the output may not be harmony at all.
    harmony: bool,
}

impl Default for Parser {
    fn default() -> Self {
        Self {
            state: State::Header,
            header: String::new(),
            pending: String::new(),
            harmony: false,
        }
    }
}

impl Parser {
    /// The events `text`, the next piece of output, completes.
    pub fn feed(&mut self, text: &str) -> Vec<Event> {
        let mut rest = std::mem::take(&mut self.pending) + text;
        let mut events = Vec::new();
        loop {
            match next_marker(&rest) {
                Some((at, marker)) => {
                    self.text(&rest[..at], &mut events);
                    self.marker(marker, &mut events);
                    rest.drain(..at + marker.len());
                }
                None => {
                    let keep = marker_prefix_len(&rest);
                    self.text(&rest[..rest.len() - keep], &mut events);
                    self.pending = rest[rest.len() - keep..].to_string();
                    return events;
                }
            }
        }
    }

    /// The events left when the output ends. An output without a single marker (not
    /// harmony at all) is returned as the text of one message without a channel; a header
    /// the output was cut off in is dropped.
    pub fn finish(&mut self) -> Vec<Event> {
        let rest = std::mem::take(&mut self.pending);
        let mut events = Vec::new();
        self.text(&rest, &mut events);
        let text = std::mem::take(&mut self.header);
        if !self.harmony && !text.is_empty() {
            events.push(Event::Message {
                channel: None,
                recipient: None,
            });
            events.push(Event::Text(text));
        }
        events
    }

    fn text(&mut self, text: &str, events: &mut Vec<Event>) {
        if text.is_empty() {
            return;
        }
        match self.state {
            State::Header => self.header += text,
            State::Content => events.push(Event::Text(text.to_string())),
            // Stray text between messages is kept rather than lost.
            State::Between => {
                events.push(Event::Message {
                    channel: None,
                    recipient: None,
                });
                events.push(Event::Text(text.to_string()));
                self.state = State::Content;
            }
        }
    }

    fn marker(&mut self, marker: &str, events: &mut Vec<Event>) {
        self.harmony = true;
        match (self.state, marker) {
            (_, START) => {
                self.state = State::Header;
                self.header.clear();
            }
            (State::Header, MESSAGE) => {
                let (channel, recipient) = parse_header(&std::mem::take(&mut self.header));
                events.push(Event::Message { channel, recipient });
                self.state = State::Content;
            }
            (State::Header, CHANNEL | CONSTRAIN) => self.header += marker,
            (_, END | RETURN | CALL) => {
                self.state = State::Between;
                self.header.clear();
            }
            // A header marker inside a message's text, or between messages: not text.
            _ => {}
        }
    }
}

/// The first marker in `text` and where it starts.
fn next_marker(text: &str) -> Option<(usize, &'static str)> {
    MARKERS
        .iter()
        .filter_map(|m| text.find(m).map(|at| (at, *m)))
        .min_by_key(|(at, _)| *at)
}

/// The length of the longest tail of `text` that is a proper start of some marker.
fn marker_prefix_len(text: &str) -> usize {
    let Some(open) = text.rfind('<') else {
        return 0;
    };
    let tail = &text[open..];
    match MARKERS.iter().any(|m| m.len() > tail.len() && m.starts_with(tail)) {
        true => tail.len(),
        false => 0,
    }
}

/// A header's channel and recipient: `[ROLE][ to=RECIPIENT]<|channel|>CHANNEL[ to=RECIPIENT][ TYPE]`.
fn parse_header(header: &str) -> (Option<String>, Option<String>) {
    (word_after(header, CHANNEL), word_after(header, "to="))
}

/// The word right after the first `prefix` in `header`, up to whitespace or a marker.
fn word_after(header: &str, prefix: &str) -> Option<String> {
    let (_, after) = header.split_once(prefix)?;
    let word = after
        .split(|c: char| c.is_whitespace() || c == '<')
        .next()
        .unwrap_or("");
    (!word.is_empty()).then(|| word.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// An assistant output and the messages openai-harmony's parser finds in it
    /// (scripts/make_harmony_fixtures.py).
    #[derive(Deserialize)]
    struct Case {
        name: String,
        completion: String,
        messages: Vec<Expected>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Expected {
        channel: Option<String>,
        recipient: Option<String>,
        content: String,
    }

    fn cases() -> Vec<Case> {
        #[derive(Deserialize)]
        struct File {
            cases: Vec<Case>,
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/harmony/parses.json");
        serde_json::from_str::<File>(&std::fs::read_to_string(path).unwrap())
            .unwrap()
            .cases
    }

    /// The messages that `events` describe.
    fn messages(events: Vec<Event>) -> Vec<Expected> {
        let mut out: Vec<Expected> = Vec::new();
        for event in events {
            match event {
                Event::Message { channel, recipient } => out.push(Expected {
                    channel,
                    recipient,
                    content: String::new(),
                }),
                Event::Text(text) => out.last_mut().expect("text before a message").content += &text,
            }
        }
        out
    }

    fn parse_in_pieces(text: &str, piece: usize) -> Vec<Event> {
        let mut parser = Parser::default();
        let mut events: Vec<Event> = crate::answer::pieces(text, piece)
            .iter()
            .flat_map(|p| parser.feed(p))
            .collect();
        events.extend(parser.finish());
        events
    }

    #[test]
    fn messages_match_openai_harmony_whole_and_streamed() {
        let all = cases();
        assert_eq!(all.len(), 7);
        for case in all {
            // Whole, then one character at a time (every marker split), then in 5s.
            for piece in [usize::MAX, 1, 5] {
                let got = messages(parse_in_pieces(&case.completion, piece.min(case.completion.len())));
                assert_eq!(got, case.messages, "{} in pieces of {piece}", case.name);
            }
        }
    }

    /// Random runs of harmony's markers, channel and recipient words and text (partial
    /// markers and non-ASCII characters included), well-formed or not: fed in random pieces,
    /// the parser reports what it reports for the whole, once its text events are joined; and
    /// the answer's reasoning, content and calls (`split_every_way`) are the same every way.
    #[test]
    fn random_output_parses_alike_in_any_pieces() {
        use crate::answer::{split_every_way, AnswerParser, Offer};
        use crate::harmony::Channels;
        use rand::rngs::StdRng;
        use rand::seq::IndexedRandom;
        use rand::{Rng, SeedableRng};
        let words = [
            "analysis",
            "final",
            "commentary",
            " to=functions.get",
            "assistant",
            " json",
            "hello",
            "<|",
            "|>",
            "<|end",
            "|",
            "<",
            " ",
            "\n",
            "é",
            "日",
        ];
        let joined = |events: Vec<Event>| {
            let mut out: Vec<Event> = Vec::new();
            for event in events {
                match (out.last_mut(), event) {
                    (_, Event::Text(t)) if t.is_empty() => {}
                    (Some(Event::Text(last)), Event::Text(t)) => last.push_str(&t),
                    (_, event) => out.push(event),
                }
            }
            out
        };
        let mut r = StdRng::seed_from_u64(20261203);
        for _ in 0..2000 {
            let text: String = (0..r.random_range(0..16))
                .map(|_| match r.random_bool(0.4) {
                    true => *MARKERS.choose(&mut r).unwrap(),
                    false => *words.choose(&mut r).unwrap(),
                })
                .collect();
            let whole = joined(parse_in_pieces(&text, text.len().max(1)));
            let chars: Vec<char> = text.chars().collect();
            let mut parser = Parser::default();
            let mut events = Vec::new();
            let mut at = 0;
            while at < chars.len() {
                let end = (at + r.random_range(1..=8)).min(chars.len());
                events.extend(parser.feed(&chars[at..end].iter().collect::<String>()));
                at = end;
            }
            events.extend(parser.finish());
            assert_eq!(joined(events), whole, "{text:?}");
            let parallel = r.random_bool(0.5);
            let channels = || AnswerParser::Harmony(Channels::offering(Offer::new(vec!["get".into()], parallel)));
            split_every_way(channels, &text);
        }
    }

    #[test]
    fn an_unfinished_header_is_not_text() {
        assert!(parse_in_pieces("<|channel|>analysis<|constrain|>", 4).is_empty());
        assert!(parse_in_pieces("<|channel|><|channel|><|end|>", 4).is_empty());
    }

    #[test]
    fn output_without_harmony_is_one_message_of_text() {
        let events = parse_in_pieces("just words <|not a marker", 3);
        assert_eq!(
            messages(events),
            [Expected {
                channel: None,
                recipient: None,
                content: "just words <|not a marker".into()
            }]
        );
    }
}

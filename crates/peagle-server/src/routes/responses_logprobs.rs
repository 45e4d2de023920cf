//! Which tokens' logprobs a response's message texts carry (`include:
//! ["message.output_text.logprobs"]`). The answer's text goes to its parser a piece per token
//! (`Update::released`: text held back by the stop strings or the detokenizer is its
//! releasing token's, with the held tokens' entries before its), and each piece's split says
//! where its text went, the parsers splitting a text alike whatever its pieces. A piece's
//! entries go with the message text it brings; a piece that brings only reasoning, a call or
//! nothing (a marker, an end of sequence) has none in a message. One that brings nothing yet
//! may have been held back by the parser, as the start of what might have been a marker: its
//! entries go with the next piece's message text where that text is longer than the piece
//! itself (it brings the held text too), and are dropped otherwise.

use super::responses_output::OutputItems;
use crate::answer::AnswerParser;
use crate::protocol::TokenLogprob;

#[derive(Debug, Default)]
pub struct TextEntries {
    /// Tokens whose text has not come out yet, held back before the parser.
    held: Vec<TokenLogprob>,
    /// Tokens whose text the parser took and gave nothing of yet.
    unshown: Vec<TokenLogprob>,
}

impl TextEntries {
    /// Adds the answer's next `text` to `output` through `parser`: `tokens` are the tokens it
    /// came with (none where logprobs are not asked for), and `released` how many of its
    /// bytes came out at each; the rest came out as the answer ended (`last`).
    pub fn add(
        &mut self,
        parser: &mut AnswerParser,
        output: &mut OutputItems,
        text: &str,
        tokens: Vec<TokenLogprob>,
        released: &[usize],
        last: bool,
    ) {
        let mut rest = text;
        for (token, &len) in tokens.into_iter().zip(released) {
            self.held.push(token);
            if len == 0 {
                continue;
            }
            let (piece, after) = rest.split_at_checked(len).unwrap_or((rest, ""));
            rest = after;
            let entries = std::mem::take(&mut self.held);
            self.piece(parser, output, piece, entries, false);
        }
        if last || !rest.is_empty() {
            let entries = match last {
                true => std::mem::take(&mut self.held),
                false => Vec::new(),
            };
            self.piece(parser, output, rest, entries, last);
        }
    }

    fn piece(
        &mut self,
        parser: &mut AnswerParser,
        output: &mut OutputItems,
        piece: &str,
        mut entries: Vec<TokenLogprob>,
        last: bool,
    ) {
        let splits = parser.split_in_order(piece, last);
        let shown: usize = splits.iter().map(|s| s.content.len()).sum();
        let anything = splits
            .iter()
            .any(|s| !s.content.is_empty() || !s.reasoning.is_empty() || !s.calls.is_empty());
        if !anything {
            self.unshown.append(&mut entries);
        } else if shown > piece.len() {
            entries.splice(0..0, std::mem::take(&mut self.unshown));
        } else {
            self.unshown.clear();
        }
        if shown == 0 {
            entries.clear();
        }
        for split in splits {
            let with = match split.content.is_empty() {
                true => Vec::new(),
                false => std::mem::take(&mut entries),
            };
            output.push(split, &with);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::{CallParser, Offer};
    use crate::harmony::Channels;
    use crate::hermes::Hermes;
    use crate::thinking::{PromptThinking, ReasoningParser, Thinking};
    use serde_json::{json, Value};

    fn token(text: &str) -> TokenLogprob {
        TokenLogprob {
            token: text.into(),
            logprob: Some(-0.5),
            top: Vec::new(),
            text_offset: 0,
        }
    }

    /// The message texts, each with its entries' tokens, after `updates`: each a list of
    /// (token, the text that came out at it), the last also the text the end released. The
    /// text deltas' entries are checked to be the messages'.
    fn messages(mut parser: AnswerParser, updates: &[&[(&str, &str)]], end: &str) -> Vec<(String, Vec<String>)> {
        let mut output = OutputItems::new(true);
        let mut entries = TextEntries::default();
        let mut events = Vec::new();
        for (i, tokens) in updates.iter().enumerate() {
            let last = i + 1 == updates.len();
            let mut text: String = tokens.iter().map(|(_, out)| *out).collect();
            if last {
                text += end;
            }
            let released: Vec<usize> = tokens.iter().map(|(_, out)| out.len()).collect();
            let tokens = tokens.iter().map(|(t, _)| token(t)).collect();
            entries.add(&mut parser, &mut output, &text, tokens, &released, last);
            events.extend(output.take_events());
        }
        output.finish("completed");
        events.extend(output.take_events());
        let in_deltas: Vec<Value> = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .flat_map(|e| e["logprobs"].as_array().unwrap().clone())
            .collect();
        let items = json!(output.items());
        let mut in_parts = Vec::new();
        let mut found = Vec::new();
        for item in items.as_array().unwrap().iter().filter(|i| i["type"] == "message") {
            let part = &item["content"][0];
            let entries = part["logprobs"].as_array().unwrap();
            in_parts.extend(entries.iter().cloned());
            let tokens = entries
                .iter()
                .map(|e| e["token"].as_str().unwrap().to_string())
                .collect();
            found.push((part["text"].as_str().unwrap().to_string(), tokens));
        }
        assert_eq!(in_deltas, in_parts, "the deltas carry the parts' entries");
        found
    }

    fn message(text: &str, tokens: &[&str]) -> (String, Vec<String>) {
        (text.to_string(), tokens.iter().map(|t| t.to_string()).collect())
    }

    /// Plain text: every token's entry in order, a token whose text was held back (a stop
    /// string's possible start, a character's first byte) before the token that released it,
    /// also across updates and at the end; an end of sequence, which brings no text, has none.
    #[test]
    fn each_token_goes_with_the_text_it_released() {
        let plain = || AnswerParser::Template {
            thinking: None,
            calls: None,
        };
        let found = messages(
            plain(),
            &[
                &[("Hi", "Hi"), (" th", " th"), ("\n", "")],
                &[("e", "\ne"), ("\u{fffd}", "")],
                &[("\u{fffd}", "\u{e9}"), ("\n", ""), ("<eos>", "")],
            ],
            "\n",
        );
        let tokens = ["Hi", " th", "\n", "e", "\u{fffd}", "\u{fffd}", "\n", "<eos>"];
        assert_eq!(found, [message("Hi th\ne\u{e9}\n", &tokens)]);
    }

    /// Reasoning's tokens and the markers around it and around calls are not the message's;
    /// text that a parser held back as a possible marker's start goes with the token that
    /// showed it was not one.
    #[test]
    fn reasoning_markers_and_calls_carry_no_entries() {
        let parser = AnswerParser::Template {
            thinking: Some(Thinking::new(ReasoningParser::Qwen3, PromptThinking::Neither)),
            calls: Some(CallParser::Hermes(Hermes::offering(Offer::new(vec!["f".into()], true)))),
        };
        let call = "{\"name\": \"f\", \"arguments\": {}}";
        let found = messages(
            parser,
            &[
                &[
                    ("<think>", "<think>"),
                    ("Hmm", "Hmm"),
                    ("</th", "</th"),
                    ("ink>", "ink>"),
                ],
                &[("Yes", "Yes"), (" ", " "), ("<", "<"), ("b", "b")],
                &[
                    ("<tool_call>", "<tool_call>"),
                    (call, call),
                    ("</tool_call>", "</tool_call>"),
                ],
            ],
            "",
        );
        assert_eq!(found, [message("Yes <b", &["Yes", " ", "<", "b"])]);
    }

    /// gpt-oss: the analysis channel and the messages' headers carry none, the final
    /// channel's text its tokens.
    #[test]
    fn harmony_headers_and_analysis_carry_no_entries() {
        let parser = AnswerParser::Harmony(Channels::offering(Offer::new(Vec::new(), true)));
        let header = [
            ("<|channel|>", "<|channel|>"),
            ("final", "final"),
            ("<|message|>", "<|message|>"),
        ];
        let found = messages(
            parser,
            &[
                &[
                    ("<|channel|>", "<|channel|>"),
                    ("analysis", "analysis"),
                    ("<|message|>", "<|message|>"),
                    ("Think", "Think"),
                ],
                &[
                    ("<|end|>", "<|end|>"),
                    ("<|start|>", "<|start|>"),
                    ("assistant", "assistant"),
                ],
                &header,
                &[("Done", "Done"), (".", "."), ("<|return|>", "")],
            ],
            "",
        );
        assert_eq!(found, [message("Done.", &["Done", "."])]);
    }
}

//! Reasoning in `<think>…</think>`, split from a chat template's model's answer as vLLM's
//! reasoning parsers split it (`--reasoning-parser`). Where the prompt leaves the thinking
//! open (a template that opens it, as Qwen3's thinking models' do), the answer is reasoning
//! up to `</think>`; where it closed it (a hybrid model's thinking turned off), the answer is
//! content. Otherwise:
//! - `deepseek_r1`: the answer is reasoning from its start (a leading `<think>` dropped) up
//!   to `</think>`, and content after it;
//! - `qwen3`: an answer that begins with `<think>` is reasoning up to `</think>` and content
//!   after it; one that does not is all content.
//!
//! An answer cut off before `</think>` is all reasoning. Streamed, text that may begin a
//! marker is held back until the next piece says what it is.

use crate::answer::partial_marker_len;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Where a prompt leaves the thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptThinking {
    /// Its last `<think>` is not closed: the answer starts in the reasoning.
    Open,
    /// Its last `</think>` comes after any `<think>`: the answer is content.
    Closed,
    Neither,
}

impl PromptThinking {
    /// Where `prompt_end`, the text of a prompt's last tokens, leaves the thinking.
    pub fn of(prompt_end: &str) -> Self {
        match (prompt_end.rfind(OPEN), prompt_end.rfind(CLOSE)) {
            (Some(open), Some(close)) if open < close => Self::Closed,
            (Some(_), _) => Self::Open,
            (None, Some(_)) => Self::Closed,
            (None, None) => Self::Neither,
        }
    }
}

/// Which of vLLM's reasoning parsers splits the answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    DeepseekR1,
    Qwen3,
    /// Harmony's analysis channel (gpt-oss), which it always has: the flag is checked, and
    /// harmony's channels split the answer.
    OpenaiGptoss,
}

impl std::fmt::Display for ReasoningParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::DeepseekR1 => "deepseek_r1",
            Self::Qwen3 => "qwen3",
            Self::OpenaiGptoss => "openai_gptoss",
        })
    }
}

impl std::str::FromStr for ReasoningParser {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "deepseek_r1" => Ok(Self::DeepseekR1),
            "qwen3" => Ok(Self::Qwen3),
            "openai_gptoss" => Ok(Self::OpenaiGptoss),
            other => Err(format!(
                "{other:?} is not a reasoning parser: expected deepseek_r1, qwen3 or openai_gptoss"
            )),
        }
    }
}

/// Where the answer is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Part {
    /// At its start, not yet known to open with `<think>`.
    Start,
    Reasoning,
    Content,
}

/// One answer's reasoning split from its content as it streams.
pub struct Thinking {
    part: Part,
    /// Whether an answer that does not open with `<think>` is reasoning all the same.
    opened_by_template: bool,
    /// Text that may begin the marker looked for.
    held: String,
}

impl Thinking {
    /// The split of `parser`'s answers (a chat template's model's: never harmony's) to a
    /// prompt that leaves the thinking as `prompt` says.
    pub fn new(parser: ReasoningParser, prompt: PromptThinking) -> Self {
        let part = match prompt {
            PromptThinking::Open => Part::Reasoning,
            PromptThinking::Closed => Part::Content,
            PromptThinking::Neither => Part::Start,
        };
        Self {
            part,
            opened_by_template: parser == ReasoningParser::DeepseekR1,
            held: String::new(),
        }
    }

    /// The reasoning and the content `text` adds; `last` gives out what was held back.
    pub fn split(&mut self, text: &str, last: bool) -> (String, String) {
        self.held += text;
        let (mut reasoning, mut content) = (String::new(), String::new());
        if self.part == Part::Start {
            let start = self.held.trim_start();
            if let Some(thinking) = start.strip_prefix(OPEN) {
                self.held = thinking.to_string();
                self.part = Part::Reasoning;
            } else if OPEN.starts_with(start) && !last {
                return (reasoning, content);
            } else {
                self.part = if self.opened_by_template {
                    Part::Reasoning
                } else {
                    Part::Content
                };
            }
        }
        if self.part == Part::Reasoning {
            if let Some(at) = self.held.find(CLOSE) {
                reasoning += &self.held[..at];
                self.held.drain(..at + CLOSE.len());
                self.part = Part::Content;
            } else {
                let keep = if last { 0 } else { partial_marker_len(&self.held, CLOSE) };
                reasoning.extend(self.held.drain(..self.held.len() - keep));
                return (reasoning, content);
            }
        }
        content += &std::mem::take(&mut self.held);
        (reasoning, content)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::{split_every_way, AnswerParser};

    /// (reasoning, content) of `text` after a prompt that leaves the thinking as `prompt`,
    /// split every way alike.
    fn split_after(parser: ReasoningParser, prompt: PromptThinking, text: &str) -> (String, String) {
        let make = || AnswerParser::Template {
            thinking: Some(Thinking::new(parser, prompt)),
            calls: None,
        };
        let (reasoning, content, _, _) = split_every_way(make, text);
        (reasoning, content)
    }

    fn split(parser: ReasoningParser, text: &str) -> (String, String) {
        split_after(parser, PromptThinking::Neither, text)
    }

    fn pair(reasoning: &str, content: &str) -> (String, String) {
        (reasoning.to_string(), content.to_string())
    }

    #[test]
    fn qwen3_reasons_only_in_an_answer_that_opens_thinking() {
        let qwen3 = ReasoningParser::Qwen3;
        assert_eq!(
            split(qwen3, "<think>\nhmm ✓\n</think>\n\nYes."),
            pair("\nhmm ✓\n", "\n\nYes.")
        );
        assert_eq!(split(qwen3, "\n<think>a</think>b</think>"), pair("a", "b</think>"));
        assert_eq!(
            split(qwen3, "Yes, <think> is a tag."),
            pair("", "Yes, <think> is a tag.")
        );
        assert_eq!(split(qwen3, "<thin"), pair("", "<thin"));
        assert_eq!(split(qwen3, "<think>cut off at </thi"), pair("cut off at </thi", ""));
        assert_eq!(split(qwen3, ""), pair("", ""));
    }

    #[test]
    fn deepseek_r1_reasons_from_the_start() {
        let r1 = ReasoningParser::DeepseekR1;
        assert_eq!(split(r1, "hmm</think>Yes."), pair("hmm", "Yes."));
        assert_eq!(split(r1, "<think>hmm</think>Yes."), pair("hmm", "Yes."));
        assert_eq!(split(r1, "still thinking"), pair("still thinking", ""));
    }

    /// A prompt that opens the thinking (Qwen3's thinking models) starts the answer in it; one
    /// that closed it (thinking turned off) makes it content, whichever the parser.
    #[test]
    fn the_prompt_says_where_the_answer_starts() {
        assert_eq!(
            PromptThinking::of("<|im_start|>assistant\n<think>\n"),
            PromptThinking::Open
        );
        assert_eq!(
            PromptThinking::of("assistant\n<think>\n\n</think>\n\n"),
            PromptThinking::Closed
        );
        assert_eq!(PromptThinking::of("</think>x<think>"), PromptThinking::Open);
        assert_eq!(PromptThinking::of("<|im_start|>assistant\n"), PromptThinking::Neither);
        for parser in [ReasoningParser::Qwen3, ReasoningParser::DeepseekR1] {
            let open = split_after(parser, PromptThinking::Open, "hmm</think>\n\nYes.");
            assert_eq!(open, pair("hmm", "\n\nYes."));
            let closed = split_after(parser, PromptThinking::Closed, "Yes.");
            assert_eq!(closed, pair("", "Yes."));
        }
    }

    #[test]
    fn parsers_go_by_vllms_names() {
        assert_eq!("qwen3".parse(), Ok(ReasoningParser::Qwen3));
        let err = "think".parse::<ReasoningParser>().unwrap_err();
        assert!(err.contains("deepseek_r1, qwen3 or openai_gptoss"), "{err}");
    }
}

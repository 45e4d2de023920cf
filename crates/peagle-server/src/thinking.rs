//! Reasoning in `<think>…</think>`, split from a chat template's model's answer as vLLM's
//! reasoning parsers split it (`--reasoning-parser`):
//! - `deepseek_r1`: the template opens the thinking, so the answer is reasoning from its start
//!   (a `<think>` there is dropped) up to `</think>`, and content after it;
//! - `qwen3`: an answer that begins with `<think>` is reasoning up to `</think>` and content
//!   after it; one that does not (thinking turned off) is all content.
//!
//! An answer cut off before `</think>` is all reasoning. Streamed, text that may begin a
//! marker is held back until the next piece says what it is.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

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
    /// The split of `parser`'s answers (a chat template's model's: never harmony's).
    pub fn new(parser: ReasoningParser) -> Self {
        Self {
            part: Part::Start,
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

/// The length of the longest tail of `text` that is a proper start of `marker` (ASCII).
pub fn partial_marker_len(text: &str, marker: &str) -> usize {
    (1..marker.len())
        .rev()
        .find(|&n| text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::pieces;

    /// (reasoning, content) of `text` split a character at a time, in 3s and whole: the same
    /// every way.
    fn split(parser: ReasoningParser, text: &str) -> (String, String) {
        let mut results = Vec::new();
        for piece in [1, 3, text.len()] {
            let mut thinking = Thinking::new(parser);
            let pieces = pieces(text, piece);
            let mut got = (String::new(), String::new());
            for (i, text) in pieces.iter().enumerate() {
                let (reasoning, content) = thinking.split(text, i + 1 == pieces.len());
                got.0 += &reasoning;
                got.1 += &content;
            }
            results.push(got);
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]), "{text:?}: {results:?}");
        results.remove(0)
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

    #[test]
    fn parsers_go_by_vllms_names() {
        assert_eq!("qwen3".parse(), Ok(ReasoningParser::Qwen3));
        let err = "think".parse::<ReasoningParser>().unwrap_err();
        assert!(err.contains("deepseek_r1, qwen3 or openai_gptoss"), "{err}");
    }
}

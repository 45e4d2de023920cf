//! What a request asks its text to be, as the OpenAI and vLLM APIs say it, compiled to a
//! grammar.

use crate::error::GrammarError;
use crate::grammar::{Grammar, GrammarBuilder};
use crate::json_schema::{object_grammar, schema_grammar};
use crate::regex::{self, Chars};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// JSON that the schema accepts (`response_format` json_schema, `guided_json`).
    JsonSchema { schema: Value, whitespace: Option<String> },
    /// Any JSON object (`response_format` json_object).
    JsonObject { whitespace: Option<String> },
    /// Text the regex matches whole (`guided_regex`).
    Regex(String),
    /// Exactly one of the strings (`guided_choice`).
    Choice(Vec<String>),
}

impl Spec {
    pub fn compile(&self) -> Result<Grammar, GrammarError> {
        match self {
            Self::JsonSchema { schema, whitespace } => schema_grammar(schema, whitespace.as_deref()),
            Self::JsonObject { whitespace } => object_grammar(whitespace.as_deref()),
            Self::Regex(pattern) => {
                let mut b = GrammarBuilder::new();
                let seq = regex::compile(&mut b, pattern, Chars::Raw)?;
                let root = b.reserve();
                b.define(root, vec![seq])?;
                Ok(b.build(root))
            }
            Self::Choice(choices) => {
                if choices.is_empty() {
                    return Err(GrammarError::Choices);
                }
                let mut b = GrammarBuilder::new();
                let root = b.reserve();
                b.define(
                    root,
                    choices.iter().map(|c| GrammarBuilder::literal(c.as_bytes())).collect(),
                )?;
                Ok(b.build(root))
            }
        }
    }

    /// A key naming the constraint, for a cache of compiled ones.
    pub fn key(&self) -> String {
        format!("{self:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_and_regexes_match_whole_texts() {
        let choice = Spec::Choice(vec!["yes".into(), "no".into(), "yes!".into()])
            .compile()
            .unwrap();
        let whole = |g: &Grammar, t: &str| g.advance_bytes(&g.start(), t.as_bytes()).accepts();
        assert!(whole(&choice, "yes") && whole(&choice, "yes!") && whole(&choice, "no"));
        assert!(!whole(&choice, "ye") && !whole(&choice, "nope"));
        assert_eq!(Spec::Choice(Vec::new()).compile().unwrap_err(), GrammarError::Choices);
        let regex = Spec::Regex(r"\d{3}".into()).compile().unwrap();
        assert!(whole(&regex, "123") && !whole(&regex, "1234"));
    }
}

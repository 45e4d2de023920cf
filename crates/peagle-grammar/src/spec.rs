//! What a request asks its text to be, as the OpenAI and vLLM APIs say it, compiled to a
//! grammar.

use crate::ebnf::ebnf_grammar;
use crate::error::GrammarError;
use crate::grammar::{Grammar, GrammarBuilder};
use crate::json_schema::{object_grammar, schema_grammar};
use crate::regex::{self, Chars};
use crate::structural_tag::structural_tag;
use crate::structure::{structure_grammar, Format};
use crate::vocabulary::Vocabulary;
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
    /// Text a GBNF grammar's `root` matches (`guided_grammar`).
    Grammar(String),
    /// A structure, special tokens among its parts (a forced harmony tool call).
    Structure(Format),
    /// An xgrammar structural tag as a request gives it (`structural_tag`), read against
    /// the model's vocabulary: its special tokens' names and ids.
    StructuralTag(Value),
}

impl Spec {
    /// The grammar for a model of `vocab`, checked to match some text and to start within
    /// what a parse state holds.
    pub fn compile(&self, vocab: &Vocabulary) -> Result<Grammar, GrammarError> {
        let grammar = self.grammar(vocab)?;
        grammar.check()?;
        Ok(grammar)
    }

    fn grammar(&self, vocab: &Vocabulary) -> Result<Grammar, GrammarError> {
        match self {
            Self::JsonSchema { schema, whitespace } => schema_grammar(schema, whitespace.as_deref()),
            Self::JsonObject { whitespace } => object_grammar(whitespace.as_deref()),
            Self::Regex(pattern) => {
                let mut b = GrammarBuilder::new();
                let seq = regex::compile(&mut b, pattern, Chars::Raw)?;
                b.finish(seq)
            }
            Self::Grammar(text) => ebnf_grammar(text),
            Self::Structure(format) => structure_grammar(format),
            Self::StructuralTag(tag) => structure_grammar(&structural_tag(tag, vocab)?),
            Self::Choice(choices) => {
                if choices.is_empty() {
                    return Err(GrammarError::Choices);
                }
                let mut b = GrammarBuilder::new();
                let texts: Vec<&[u8]> = choices.iter().map(|c| c.as_bytes()).collect();
                let one = b.one_of(&texts)?;
                b.finish(vec![one])
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

    /// A grammar that names no token compiles alike for every vocabulary.
    fn no_names() -> Vocabulary {
        Vocabulary::new(Vec::new())
    }

    #[test]
    fn choices_and_regexes_match_whole_texts() {
        let choice = Spec::Choice(vec!["yes".into(), "no".into(), "yes!".into()])
            .compile(&no_names())
            .unwrap();
        let whole = |g: &Grammar, t: &str| g.advance_bytes(&g.start(), t.as_bytes()).accepts();
        assert!(whole(&choice, "yes") && whole(&choice, "yes!") && whole(&choice, "no"));
        assert!(!whole(&choice, "ye") && !whole(&choice, "nope"));
        assert_eq!(
            Spec::Choice(Vec::new()).compile(&no_names()).unwrap_err(),
            GrammarError::Choices
        );
        let regex = Spec::Regex(r"\d{3}".into()).compile(&no_names()).unwrap();
        assert!(whole(&regex, "123") && !whole(&regex, "1234"));
    }

    /// Ten thousand choices (sharing beginnings, as numbers do) compile to a trie: a parse
    /// holds one stack per next byte, and each choice, and nothing else, matches.
    #[test]
    fn many_choices_share_their_beginnings() {
        let choices: Vec<String> = (0..10_000).map(|n| format!("id-{n}")).collect();
        let g = Spec::Choice(choices.clone()).compile(&no_names()).unwrap();
        let whole = |t: &str| g.advance_bytes(&g.start(), t.as_bytes()).accepts();
        assert!(choices.iter().all(|c| whole(c)));
        assert!(!whole("id-") && !whole("id-10000") && !whole("id-01"));
        assert_eq!(g.advance_bytes(&g.start(), b"id-").stacks_len(), 10);
    }

    /// What no text matches, and chains of references too deep to follow, are refused
    /// (not a stack overflow).
    #[test]
    fn empty_and_too_deep_grammars_are_refused() {
        let json = |schema: serde_json::Value| {
            Spec::JsonSchema {
                schema,
                whitespace: None,
            }
            .compile(&no_names())
        };
        assert_eq!(json(serde_json::json!({"$ref": "#"})).unwrap_err(), GrammarError::Empty);
        assert_eq!(
            Spec::Regex(r"[^\s\S]".into()).compile(&no_names()).unwrap_err(),
            GrammarError::Empty
        );
        let mut defs = serde_json::Map::new();
        for i in 0..100_000 {
            defs.insert(
                format!("a{i}"),
                serde_json::json!({"$ref": format!("#/$defs/a{}", i + 1)}),
            );
        }
        defs.insert("a100000".into(), serde_json::json!({"type": "integer"}));
        let chain = serde_json::json!({"$defs": defs, "$ref": "#/$defs/a0"});
        assert!(matches!(json(chain).unwrap_err(), GrammarError::Schema { why, .. } if why.contains("deeper")));
    }
}

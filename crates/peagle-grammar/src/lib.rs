//! Structured output: what a request's text must match (a JSON schema, any JSON object, a
//! regex, one of some strings, a GBNF grammar, a structure with special tokens such as
//! xgrammar's structural tags), compiled to a grammar over bytes, and the tokens of a model's
//! vocabulary each point of a parse allows.

pub mod bounds;
pub mod constraint;
pub mod ebnf;
pub mod error;
mod free_text;
pub mod grammar;
pub mod int_range;
pub mod json_schema;
pub mod number_range;
#[cfg(test)]
mod random_patterns;
pub mod regex;
pub mod spec;
pub mod state;
pub mod structural_tag;
pub mod structure;
mod trie;
pub mod vocabulary;

pub use constraint::{Constraint, TokenMask};
pub use error::GrammarError;
pub use grammar::{Grammar, GrammarBuilder};
pub use spec::Spec;
pub use state::State;
pub use structure::{Format, Literal};
pub use vocabulary::Vocabulary;

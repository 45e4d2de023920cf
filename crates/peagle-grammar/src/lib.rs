//! Structured output: what a request's text must match (a JSON schema, any JSON object, a
//! regex, one of some strings, a structure with special tokens), compiled to a grammar over
//! bytes, and the tokens of a model's vocabulary each point of a parse allows.

pub mod bounds;
pub mod constraint;
pub mod ebnf;
pub mod error;
pub mod grammar;
pub mod int_range;
pub mod json_schema;
pub mod number_range;
pub mod regex;
pub mod spec;
pub mod state;
pub mod structure;
mod trie;
pub mod vocabulary;

pub use constraint::{Constraint, TokenMask};
pub use error::GrammarError;
pub use grammar::{Grammar, GrammarBuilder};
pub use spec::Spec;
pub use state::State;
pub use structure::Piece;
pub use vocabulary::Vocabulary;

use thiserror::Error;

/// Why a constraint cannot be compiled into a grammar.
#[derive(Debug, Error, PartialEq)]
pub enum GrammarError {
    #[error("invalid regex: {0}")]
    Regex(String),
    #[error("regex feature not supported: {0}")]
    RegexFeature(String),
    #[error("invalid JSON schema at {path}: {why}")]
    Schema { path: String, why: String },
    #[error("JSON schema keyword not supported at {path}: {keyword}")]
    SchemaKeyword { path: String, keyword: String },
    #[error("the choices must be a non-empty list of strings")]
    Choices,
    #[error("the grammar is too large (more than {0} elements)")]
    TooLarge(usize),
    #[error("invalid grammar: {0}")]
    Ebnf(String),
    #[error("invalid structural tag: {0}")]
    Structure(String),
    #[error("no text matches it")]
    Empty,
    #[error("it is too ambiguous: more than {0} ways to begin")]
    TooAmbiguous(usize),
    #[error("the tokenizer's decoder ({0}) does not say which bytes each token stands for")]
    Tokenizer(String),
}

//! Structures: texts built of formats, special tokens among them, as xgrammar's structural
//! tags describe them (`structural_tag` reads a request's). A chat format's message syntax
//! around free text and JSON (harmony's analysis message, then a tool call's header and its
//! arguments under their schema) is one; so is free text in which a trigger starts a tool
//! call. A special token is matched by its spelling (`special_token_bytes`), which no text
//! token can make.

use crate::ebnf::ebnf_grammar;
use crate::error::GrammarError;
use crate::free_text::{free_text, FreeText};
use crate::grammar::{Grammar, GrammarBuilder, Seq};
use crate::json_schema::schema_element;
use crate::regex::{self, Chars};
use crate::vocabulary::special_token_bytes;
use serde_json::Value;

/// One symbol of a literal: a character, or a special token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Symbol {
    Char(char),
    Token(u32),
}

impl Symbol {
    /// The bytes that spell it: a character's UTF-8, a token's `special_token_bytes`.
    pub fn bytes(self) -> Vec<u8> {
        match self {
            Self::Char(c) => c.to_string().into_bytes(),
            Self::Token(id) => special_token_bytes(id).to_vec(),
        }
    }
}

/// Exact text, special tokens among its characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Literal(pub Vec<Symbol>);

impl Literal {
    pub fn text(text: &str) -> Self {
        Self(text.chars().map(Symbol::Char).collect())
    }

    pub fn token(id: u32) -> Self {
        Self(vec![Symbol::Token(id)])
    }

    /// `text`, the special tokens it holds the `names` of as those tokens (the longest name
    /// where several start at a character).
    pub fn named(text: &str, names: &[(&str, u32)]) -> Self {
        let mut symbols = Vec::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let named = names
                .iter()
                .filter(|(name, _)| !name.is_empty() && rest.starts_with(name))
                .max_by_key(|(name, _)| name.len());
            match named {
                Some((name, id)) => {
                    symbols.push(Symbol::Token(*id));
                    rest = &rest[name.len()..];
                }
                None => {
                    symbols.push(Symbol::Char(c));
                    rest = &rest[c.len_utf8()..];
                }
            }
        }
        Self(symbols)
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|s| s.bytes()).collect()
    }
}

/// Quoted, its tokens by id: `"<function=" <token 7>`.
impl std::fmt::Display for Literal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = String::new();
        let mut parts = Vec::new();
        for symbol in &self.0 {
            match symbol {
                Symbol::Char(c) => text.push(*c),
                Symbol::Token(id) => {
                    if !text.is_empty() {
                        parts.push(format!("{:?}", std::mem::take(&mut text)));
                    }
                    parts.push(format!("<token {id}>"));
                }
            }
        }
        if !text.is_empty() || parts.is_empty() {
            parts.push(format!("{text:?}"));
        }
        f.write_str(&parts.join(" "))
    }
}

/// A part of a structure: what it matches.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// Exactly this.
    Literal(Literal),
    /// JSON text that the schema accepts, with the default whitespace between its tokens.
    Json(Value),
    /// Text the regex matches whole.
    Regex(String),
    /// Text that a GBNF grammar's `root` matches.
    Grammar(String),
    /// The formats one after another.
    Sequence(Vec<Format>),
    /// One of the formats.
    Or(Vec<Format>),
    /// The format `min` to `max` times (no limit when None).
    Repeat {
        content: Box<Format>,
        min: u32,
        max: Option<u32>,
    },
    /// `begin`, the content, then one of `ends`. Free text at the content's end holds none of
    /// the ends, so the first one closes the tag.
    Tag(Tag),
    /// Free text (UTF-8 characters, and with `any_token` any special token, else a special
    /// token only where a pattern names it) that holds none of `excludes`, where a pattern of
    /// `dispatch` is followed by its format; after that format, free text again if `again`,
    /// else the end. The text may end anywhere outside a dispatched format. With no
    /// patterns, it is any text.
    FreeText {
        excludes: Vec<Literal>,
        dispatch: Vec<(Literal, Format)>,
        again: bool,
        any_token: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tag {
    pub begin: Literal,
    pub content: Box<Format>,
    pub ends: Vec<Literal>,
}

impl Format {
    pub fn text(text: &str) -> Self {
        Self::Literal(Literal::text(text))
    }

    pub fn token(id: u32) -> Self {
        Self::Literal(Literal::token(id))
    }

    /// Any text: UTF-8 characters, no special token among them.
    pub fn any_text() -> Self {
        Self::FreeText {
            excludes: Vec::new(),
            dispatch: Vec::new(),
            again: true,
            any_token: false,
        }
    }

    /// The format any number of times, none included.
    pub fn star(self) -> Self {
        Self::Repeat {
            content: Box::new(self),
            min: 0,
            max: None,
        }
    }
}

/// The grammar of `format`.
pub fn structure_grammar(format: &Format) -> Result<Grammar, GrammarError> {
    let mut b = GrammarBuilder::new();
    let seq = compile(&mut b, format, &[])?;
    b.finish(seq)
}

/// The elements matching `format`, where one of `ends` (or the end of the text) follows it:
/// free text at its end holds none of them, so that the first one ends it.
fn compile(b: &mut GrammarBuilder, format: &Format, ends: &[Literal]) -> Result<Seq, GrammarError> {
    Ok(match format {
        Format::Literal(literal) => GrammarBuilder::literal(&literal.bytes()),
        Format::Json(schema) => vec![schema_element(b, schema, None)?],
        Format::Regex(pattern) => regex::compile(b, pattern, Chars::Raw)?,
        Format::Grammar(text) => vec![b.embed(ebnf_grammar(text)?)?],
        Format::Sequence(formats) => {
            let mut seq = Seq::new();
            for (i, f) in formats.iter().enumerate() {
                let last = i + 1 == formats.len();
                seq.extend(compile(b, f, if last { ends } else { &[] })?);
            }
            seq
        }
        Format::Or(formats) => {
            let alternatives = formats
                .iter()
                .map(|f| compile(b, f, ends))
                .collect::<Result<Vec<Seq>, GrammarError>>()?;
            vec![b.rule(alternatives)?]
        }
        Format::Repeat { content, min, max } => {
            let once = compile(b, content, ends)?;
            b.repeat(once, *min, *max)?
        }
        Format::Tag(tag) => {
            let mut seq = GrammarBuilder::literal(&tag.begin.bytes());
            seq.extend(compile(b, &tag.content, &tag.ends)?);
            let ends: Vec<Vec<u8>> = tag.ends.iter().map(Literal::bytes).collect();
            let ends: Vec<&[u8]> = ends.iter().map(|e| &e[..]).collect();
            seq.push(b.one_of(&ends)?);
            seq
        }
        Format::FreeText {
            excludes,
            dispatch,
            again,
            any_token,
        } => {
            let excludes: Vec<Literal> = excludes.iter().chain(ends).cloned().collect();
            let dispatch = dispatch
                .iter()
                .map(|(pattern, f)| Ok((pattern.clone(), compile(b, f, &[])?)))
                .collect::<Result<Vec<(Literal, Seq)>, GrammarError>>()?;
            let text = FreeText {
                excludes: &excludes,
                dispatch: &dispatch,
                again: *again,
                any_token: *any_token,
            };
            vec![free_text(b, &text)?]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraint::Constraint;
    use crate::vocabulary::{Vocabulary, SPECIAL_MARK};
    use serde_json::json;
    use std::sync::Arc;

    /// Tokens: 0 "<" (text), 1 and 2 special, 3 "ok", 4 "{", 5 "}", 6 "\"a\"", 7 ":", 8 "1",
    /// 9 "\xFF" and 10 "\xFF\x00" (junk text holding the mark), 11 "é" split as 11 "\xC3",
    /// 12 "\xA9".
    fn vocab() -> Arc<Vocabulary> {
        let text = |t: &[u8]| Some(t.to_vec());
        Arc::new(Vocabulary::new(vec![
            text(b"<"),
            None,
            None,
            text(b"ok"),
            text(b"{"),
            text(b"}"),
            text(b"\"a\""),
            text(b":"),
            text(b"1"),
            text(&[SPECIAL_MARK]),
            text(&[SPECIAL_MARK, 0]),
            text(&[0xC3]),
            text(&[0xA9]),
        ]))
    }

    /// `1 free-text 2 {"a": 1}` or `2 {"a": 1}`: a free message, then JSON after a special.
    fn call() -> Format {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 1}},
                            "required": ["a"], "additionalProperties": false});
        Format::Sequence(vec![
            Format::Sequence(vec![Format::token(1), Format::any_text()]).star(),
            Format::token(2),
            Format::Json(schema),
        ])
    }

    fn allowed(c: &Constraint, tokens: &[u32]) -> Vec<u32> {
        let state = tokens.iter().fold(c.start(), |s, &t| c.advance(&s, t));
        (0..13).filter(|&t| c.allowed(&state).allows(t)).collect()
    }

    #[test]
    fn special_tokens_are_matched_by_their_ids_and_text_around_them() {
        let c = Constraint::new(structure_grammar(&call()).unwrap(), vocab());
        assert_eq!(allowed(&c, &[]), [1, 2], "a special token opens it, no text");
        assert_eq!(
            allowed(&c, &[1]),
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 11],
            "free text: any UTF-8 but not the mark's junk; either special"
        );
        assert_eq!(allowed(&c, &[1, 11]), [12], "a character's second half");
        assert_eq!(allowed(&c, &[1, 3, 0, 2]), [4], "the JSON follows special 2");
        let whole = [1, 3, 2, 4, 6, 7, 8, 5];
        let state = whole.iter().fold(c.start(), |s, &t| c.advance(&s, t));
        assert!(state.is_final());
        assert!(
            c.advance(&c.start(), 9).is_dead(),
            "junk holding the mark is no special"
        );
    }

    #[test]
    fn or_picks_a_sequence() {
        let format = Format::Or(vec![
            Format::Sequence(vec![Format::token(1), Format::text("ok")]),
            Format::Sequence(vec![Format::token(2), Format::text("<")]),
        ]);
        let c = Constraint::new(structure_grammar(&format).unwrap(), vocab());
        assert_eq!(allowed(&c, &[1]), [3]);
        assert_eq!(allowed(&c, &[2]), [0]);
    }

    fn matches(format: &Format, text: &str) -> bool {
        let g = structure_grammar(format).unwrap();
        g.advance_bytes(&g.start(), text.as_bytes()).accepts()
    }

    /// Free text inside a tag stops at the tag's first end: `<t>a</t>b</t>` is no tag.
    #[test]
    fn a_tag_ends_at_its_first_end() {
        let tag = Format::Tag(Tag {
            begin: Literal::text("<t>"),
            content: Box::new(Format::any_text()),
            ends: vec![Literal::text("</t>"), Literal::text("</u>")],
        });
        assert!(!matches(&tag, "<t>a</t") && matches(&tag, "<t>a</t>"));
        assert!(matches(&tag, "<t></u>") && matches(&tag, "<t>a</t </u>"));
        assert!(!matches(&tag, "<t>a</t>b</t>"), "the first end closes it");
        let then_json = Format::Sequence(vec![tag, Format::Json(json!({"type": "integer"}))]);
        assert!(matches(&then_json, "<t>x</t>12"));
        assert!(!matches(&then_json, "<t>x</t>y</t>12"));
    }

    /// The other formats compose: a regex, a GBNF grammar and a bounded repeat.
    #[test]
    fn regexes_grammars_and_repeats_compose() {
        let format = Format::Sequence(vec![
            Format::Regex("[a-c]+".into()),
            Format::Repeat {
                content: Box::new(Format::Grammar("root ::= \"x\" [0-9]".into())),
                min: 1,
                max: Some(2),
            },
        ]);
        assert!(matches(&format, "abx1") && matches(&format, "cx1x2"));
        assert!(!matches(&format, "ab") && !matches(&format, "ax1x2x3") && !matches(&format, "x1"));
    }
}

//! Texts with special tokens in them: a chat format's message syntax around free text and
//! JSON (harmony's analysis message, then a tool call's header, its arguments under their
//! schema and `<|call|>`), as vLLM's structural tags describe them. A special token is
//! matched by its spelling (`special_token_bytes`), which no text token can make.

use crate::error::GrammarError;
use crate::grammar::{Grammar, GrammarBuilder, Seq};
use crate::json_schema::schema_element;
use crate::vocabulary::special_token_bytes;
use serde_json::Value;

/// One part of a structure.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// The special token with this id.
    Special(u32),
    /// This text.
    Text(String),
    /// Any text: UTF-8 characters, no special token among them.
    AnyText,
    /// JSON text that the schema accepts, with the default whitespace between its tokens.
    Json(Value),
    /// One of these sequences.
    OneOf(Vec<Vec<Piece>>),
    /// This sequence any number of times, none included.
    Repeated(Vec<Piece>),
}

/// The grammar of `pieces`, one after another.
pub fn structure_grammar(pieces: &[Piece]) -> Result<Grammar, GrammarError> {
    let mut b = GrammarBuilder::new();
    let seq = sequence(&mut b, pieces)?;
    b.finish(seq)
}

fn sequence(b: &mut GrammarBuilder, pieces: &[Piece]) -> Result<Seq, GrammarError> {
    let mut seq = Seq::new();
    for piece in pieces {
        match piece {
            Piece::Special(id) => seq.extend(GrammarBuilder::literal(&special_token_bytes(*id))),
            Piece::Text(text) => seq.extend(GrammarBuilder::literal(text.as_bytes())),
            Piece::AnyText => {
                let char = b.chars(&[('\0', char::MAX)])?;
                seq.push(b.star(vec![char])?);
            }
            Piece::Json(schema) => seq.push(schema_element(b, schema, None)?),
            Piece::OneOf(choices) => {
                let alternatives = choices
                    .iter()
                    .map(|choice| sequence(b, choice))
                    .collect::<Result<Vec<Seq>, GrammarError>>()?;
                seq.push(b.rule(alternatives)?);
            }
            Piece::Repeated(pieces) => {
                let once = sequence(b, pieces)?;
                seq.push(b.star(once)?);
            }
        }
    }
    Ok(seq)
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
    fn call() -> Vec<Piece> {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 1, "maximum": 1}},
                            "required": ["a"], "additionalProperties": false});
        vec![
            Piece::Repeated(vec![Piece::Special(1), Piece::AnyText]),
            Piece::Special(2),
            Piece::Json(schema),
        ]
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
    fn one_of_picks_a_sequence() {
        let pieces = vec![Piece::OneOf(vec![
            vec![Piece::Special(1), Piece::Text("ok".into())],
            vec![Piece::Special(2), Piece::Text("<".into())],
        ])];
        let c = Constraint::new(structure_grammar(&pieces).unwrap(), vocab());
        assert_eq!(allowed(&c, &[1]), [3]);
        assert_eq!(allowed(&c, &[2]), [0]);
    }
}

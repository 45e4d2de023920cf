//! Structured output in the engine: a request whose text must follow a grammar
//! (`peagle_grammar::Constraint`) has every token outside it banned, from its first generated
//! token or from the end of a trigger (a reasoning model's end of thinking, say: its thoughts
//! are free, its answer constrained, as vLLM does with a reasoning parser).
//!
//! Where the text so far is whole, the stop tokens are allowed too; where no text can follow
//! (or the text left the grammar, which only a row with nothing left can cause), only they
//! are, and then end-of-sequence even under `ignore_eos` and before `min_tokens` (the
//! `Adjuster` passes them): the choice ends, or its text stays whole, rather than every token
//! being banned. As with the other adjustments, row i of a
//! verification window follows the drafts before it, so speculation keeps the output exact.

use peagle_grammar::{Constraint, State};
use peagle_kernels::{allows, TOKEN_MASK_WORD_BITS};
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq)]
pub struct StructuredOutput {
    pub constraint: Arc<Constraint>,
    /// The tokens after which the constraint starts; empty for the first generated token.
    pub trigger: Vec<u32>,
}

/// Where a sequence's structured output stands after some tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum Cursor {
    /// The trigger has not come: the last tokens, as many as it has less one.
    Waiting(Vec<u32>),
    Parsing(State),
}

impl StructuredOutput {
    /// The cursor before any generated token.
    pub fn start(&self) -> Cursor {
        match self.trigger.is_empty() {
            true => Cursor::Parsing(self.constraint.start()),
            false => Cursor::Waiting(Vec::new()),
        }
    }

    /// The cursor after `token` follows `cursor`.
    pub fn advance(&self, cursor: &Cursor, token: u32) -> Cursor {
        match cursor {
            Cursor::Parsing(state) => Cursor::Parsing(self.constraint.advance(state, token)),
            Cursor::Waiting(recent) => {
                let mut recent = recent.clone();
                recent.push(token);
                if recent == self.trigger {
                    return Cursor::Parsing(self.constraint.start());
                }
                let keep = self.trigger.len() - 1;
                if recent.len() > keep {
                    recent.drain(..recent.len() - keep);
                }
                Cursor::Waiting(recent)
            }
        }
    }

    /// Whether nothing but the end may follow `cursor`: the text is whole and no byte can
    /// follow, or it left the grammar.
    pub fn only_ends(&self, cursor: &Cursor) -> bool {
        matches!(cursor, Cursor::Parsing(state) if state.is_final())
    }

    /// The tokens of a `vocab`-wide row allowed at `cursor`, where `stop_ids` end the text, as
    /// bits that `peagle_kernels::allows` reads (a GPU bans the others where the logits lie);
    /// None before the trigger, where every token is.
    pub fn allowed(&self, cursor: &Cursor, stop_ids: &[u32], vocab: usize) -> Option<Vec<u32>> {
        let Cursor::Parsing(state) = cursor else {
            return None;
        };
        let mask = self.constraint.allowed(state);
        let mut words = vec![0u32; vocab.div_ceil(TOKEN_MASK_WORD_BITS)];
        let halves = mask.bits().iter().flat_map(|&w| [w as u32, (w >> 32) as u32]);
        for (word, half) in words.iter_mut().zip(halves) {
            *word = half;
        }
        if state.accepts() || state.is_dead() {
            for &t in stop_ids.iter().filter(|&&t| (t as usize) < vocab) {
                words[t as usize / TOKEN_MASK_WORD_BITS] |= 1 << (t as usize % TOKEN_MASK_WORD_BITS);
            }
        }
        Some(words)
    }

    /// The tokens of a `vocab`-wide row banned at `cursor`: those `allowed` leaves out.
    pub fn banned(&self, cursor: &Cursor, stop_ids: &[u32], vocab: usize) -> Vec<u32> {
        match self.allowed(cursor, stop_ids, vocab) {
            Some(words) => (0..vocab as u32).filter(|&t| !allows(&words, t)).collect(),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peagle_grammar::{Spec, Vocabulary};

    /// Tokens 0..=9 are the digits, 10 is "!", 11 and 12 are not text (stop, trigger).
    fn digits(trigger: Vec<u32>) -> StructuredOutput {
        let mut tokens: Vec<Option<Vec<u8>>> = (b'0'..=b'9').map(|d| Some(vec![d])).collect();
        tokens.extend([Some(b"!".to_vec()), None, None]);
        let vocab = Arc::new(Vocabulary::new(tokens));
        let grammar = Spec::Regex(r"[1-9][0-9]?".into()).compile(&vocab).unwrap();
        StructuredOutput {
            constraint: Arc::new(Constraint::new(grammar, vocab)),
            trigger,
        }
    }

    #[test]
    fn tokens_are_banned_by_the_grammar_and_stops_once_the_text_is_whole() {
        let s = digits(Vec::new());
        let stop = [11];
        let mut cursor = s.start();
        assert_eq!(
            s.banned(&cursor, &stop, 13),
            [0, 10, 11, 12],
            "a leading digit, not zero"
        );
        cursor = s.advance(&cursor, 4);
        assert_eq!(s.banned(&cursor, &stop, 13), [10, 12], "another digit or the end");
        cursor = s.advance(&cursor, 2);
        assert_eq!(
            s.banned(&cursor, &stop, 13),
            (0..11).chain([12]).collect::<Vec<_>>(),
            "only the end"
        );
        cursor = s.advance(&cursor, 10);
        assert_eq!(
            s.banned(&cursor, &stop, 13),
            (0..11).chain([12]).collect::<Vec<_>>(),
            "a text out of the grammar may only stop"
        );
    }

    #[test]
    fn the_constraint_starts_after_its_trigger() {
        let s = digits(vec![12, 10]);
        let mut cursor = s.start();
        for token in [10, 12, 3, 12] {
            assert_eq!(
                s.banned(&cursor, &[11], 13),
                Vec::<u32>::new(),
                "free before the trigger"
            );
            cursor = s.advance(&cursor, token);
        }
        cursor = s.advance(&cursor, 10);
        assert_eq!(cursor, Cursor::Parsing(s.constraint.start()));
        assert_eq!(s.banned(&cursor, &[11], 13), [0, 10, 11, 12]);
    }
}

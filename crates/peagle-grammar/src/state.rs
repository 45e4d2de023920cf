//! Where a parse of a grammar stands after some bytes: every way the bytes so far can go on,
//! as a set of stacks (the approach of llama.cpp's GBNF sampler). A stack's top is the
//! position of the byte set that must match next; an empty stack means the text may end here.

use crate::error::GrammarError;
use crate::grammar::{Element, Grammar, RuleId};
use std::collections::HashSet;

/// The most positions a stack may hold, and the most stacks a state may hold: a grammar
/// that goes deeper or wider (left recursion, a heavily ambiguous regex) has those ways cut,
/// rather than the parse running away.
const MAX_DEPTH: usize = 1024;
const MAX_STACKS: usize = 4096;

/// A position in a grammar: element `elem` of alternative `alt` of rule `rule`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
struct Pos {
    rule: RuleId,
    alt: u32,
    elem: u32,
}

/// A parse's state: the stacks, sorted and distinct, so equal states compare equal.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct State {
    stacks: Vec<Vec<Pos>>,
}

impl State {
    /// The state of text that no grammar text starts with.
    pub fn dead() -> Self {
        Self { stacks: Vec::new() }
    }

    /// The text so far is whole: the grammar may end here.
    pub fn accepts(&self) -> bool {
        self.stacks.iter().any(Vec::is_empty)
    }

    /// No byte can follow, and the text so far may end here or never matched at all.
    pub fn is_final(&self) -> bool {
        self.stacks.iter().all(Vec::is_empty)
    }

    /// The text so far is no prefix of the grammar's.
    pub fn is_dead(&self) -> bool {
        self.stacks.is_empty()
    }

    /// How many ways the parse may go on.
    pub fn stacks_len(&self) -> usize {
        self.stacks.len()
    }

    /// How many positions its stacks hold in all (its size).
    pub fn positions(&self) -> usize {
        self.stacks.iter().map(Vec::len).sum()
    }
}

impl Grammar {
    /// The state before any byte.
    pub fn start(&self) -> State {
        normalized(self.settle(self.alternatives(Vec::new(), self.start)))
    }

    /// Refuses a grammar no text matches, or one whose start the parser cuts (more ways to
    /// begin than a state holds).
    pub fn check(&self) -> Result<(), GrammarError> {
        let start = self.start();
        if start.is_dead() {
            return Err(GrammarError::Empty);
        }
        if start.stacks.len() >= MAX_STACKS {
            return Err(GrammarError::TooAmbiguous(MAX_STACKS));
        }
        Ok(())
    }

    /// The state after `byte` follows `state`.
    pub fn advance(&self, state: &State, byte: u8) -> State {
        let mut stacks = Vec::new();
        for stack in &state.stacks {
            let Some(&top) = stack.last() else { continue };
            let Some(Element::Bytes(set)) = self.element(top) else {
                unreachable!("a stack's top is a byte set")
            };
            if set.contains(byte) {
                let mut next = stack.clone();
                next.pop();
                next.push(Pos {
                    elem: top.elem + 1,
                    ..top
                });
                stacks.extend(self.settle(vec![next]));
            }
        }
        normalized(stacks)
    }

    /// The state after `bytes` follow `state`.
    pub fn advance_bytes(&self, state: &State, bytes: &[u8]) -> State {
        let mut state = state.clone();
        for &b in bytes {
            if state.is_dead() {
                break;
            }
            state = self.advance(&state, b);
        }
        state
    }

    fn element(&self, pos: Pos) -> Option<Element> {
        self.rules[pos.rule as usize][pos.alt as usize]
            .get(pos.elem as usize)
            .copied()
    }

    /// `stack` with each alternative of `rule` pushed on it (the stack being the
    /// continuation after the rule).
    fn alternatives(&self, stack: Vec<Pos>, rule: RuleId) -> Vec<Vec<Pos>> {
        (0..self.rules[rule as usize].len() as u32)
            .map(|alt| {
                let mut next = stack.clone();
                next.push(Pos { rule, alt, elem: 0 });
                next
            })
            .collect()
    }

    /// Moves each stack of `work` to where its next byte set is (into rules, out of
    /// finished alternatives) and returns every stack that gives: iteratively, as a chain of
    /// rules entered before a byte may be long. `seen` holds the stacks a rule was entered
    /// from without reading a byte: entering one again (a repetition of something that can be
    /// empty) gives nothing new, so it ends there. A stack deeper than `MAX_DEPTH`, and stacks
    /// past `MAX_STACKS`, are cut.
    fn settle(&self, mut work: Vec<Vec<Pos>>) -> Vec<Vec<Pos>> {
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        while let Some(mut stack) = work.pop() {
            if out.len() >= MAX_STACKS {
                break;
            }
            loop {
                let Some(&top) = stack.last() else {
                    out.push(stack);
                    break;
                };
                match self.element(top) {
                    None => {
                        stack.pop();
                    }
                    Some(Element::Bytes(_)) => {
                        out.push(stack);
                        break;
                    }
                    Some(Element::Rule(rule)) => {
                        if stack.len() > MAX_DEPTH || !seen.insert(stack.clone()) {
                            break;
                        }
                        stack.pop();
                        // The continuation, unless the rule ends its alternative (tail call).
                        let after = Pos {
                            elem: top.elem + 1,
                            ..top
                        };
                        if self.element(after).is_some() {
                            stack.push(after);
                        }
                        work.extend(self.alternatives(stack, rule));
                        break;
                    }
                }
            }
        }
        out
    }
}

fn normalized(mut stacks: Vec<Vec<Pos>>) -> State {
    stacks.sort_unstable();
    stacks.dedup();
    State { stacks }
}

#[cfg(test)]
mod tests {
    use crate::grammar::{Grammar, GrammarBuilder};

    /// Whether `grammar` matches `text` whole.
    pub fn matches(grammar: &Grammar, text: &[u8]) -> bool {
        grammar.advance_bytes(&grammar.start(), text).accepts()
    }

    /// `(ab|a)*c?` built by hand: repetition, alternatives, an optional tail.
    fn hand_built() -> Grammar {
        let mut b = GrammarBuilder::new();
        let ab = GrammarBuilder::literal(b"ab");
        let a = GrammarBuilder::literal(b"a");
        let either = b.rule(vec![ab, a]).unwrap();
        let star = b.star(vec![either]).unwrap();
        let c = b.optional(GrammarBuilder::literal(b"c")).unwrap();
        b.finish(vec![star, c]).unwrap()
    }

    #[test]
    fn a_hand_built_grammar_matches_its_language_only() {
        let g = hand_built();
        for text in ["", "a", "ab", "aab", "abac", "c", "aaaaaaaaaaaaaaaaaaaaaaaaaaaac"] {
            assert!(matches(&g, text.as_bytes()), "{text:?}");
        }
        for text in ["b", "abb", "cc", "ca", "abcx"] {
            assert!(!matches(&g, text.as_bytes()), "{text:?}");
        }
        let dead = g.advance_bytes(&g.start(), b"bb");
        assert!(dead.is_dead() && !dead.accepts());
        let after_c = g.advance_bytes(&g.start(), b"ac");
        assert!(after_c.is_final(), "nothing may follow the c");
        let after_a = g.advance_bytes(&g.start(), b"a");
        assert!(after_a.accepts() && !after_a.is_final());
    }

    #[test]
    fn a_long_repetition_keeps_the_stacks_shallow() {
        let g = hand_built();
        let state = g.advance_bytes(&g.start(), &b"ab".repeat(5000));
        assert!(state.accepts());
        assert!(state.stacks.iter().all(|s| s.len() <= 3), "{:?}", state.stacks);
    }

    #[test]
    fn repeating_what_can_be_empty_terminates() {
        let mut b = GrammarBuilder::new();
        let a = b.star(GrammarBuilder::literal(b"a")).unwrap();
        let outer = b.star(vec![a]).unwrap();
        let tail = GrammarBuilder::literal(b"b");
        let mut seq = vec![outer];
        seq.extend(tail);
        let g = b.finish(seq).unwrap();
        assert!(matches(&g, b"aaab") && matches(&g, b"b"));
        assert!(!matches(&g, b"aa") && !matches(&g, b"ba"));
    }

    #[test]
    fn bounded_repetition_counts() {
        let mut b = GrammarBuilder::new();
        let seq = b.repeat(GrammarBuilder::literal(b"xy"), 2, Some(4)).unwrap();
        let g = b.finish(seq).unwrap();
        let counts: Vec<usize> = (0..7).filter(|&n| matches(&g, &b"xy".repeat(n))).collect();
        assert_eq!(counts, [2, 3, 4]);
    }

    #[test]
    fn characters_match_as_utf8_bytes_and_a_token_may_split_one() {
        let mut b = GrammarBuilder::new();
        let class = b.chars(&[('a', 'c'), ('é', 'é'), ('日', '日')]).unwrap();
        let seq = b.repeat(vec![class], 1, None).unwrap();
        let g = b.finish(seq).unwrap();
        assert!(matches(&g, "abé日c".as_bytes()));
        assert!(!matches(&g, "d".as_bytes()) && !matches(&g, "è".as_bytes()));
        let bytes = "日".as_bytes();
        let half = g.advance_bytes(&g.start(), &bytes[..1]);
        assert!(!half.is_dead() && !half.accepts(), "inside a character");
        assert!(g.advance_bytes(&half, &bytes[1..]).accepts());
    }
}

//! A grammar over bytes: rules, each a list of alternatives, each a sequence of elements that
//! match one byte of a set or a whole rule. The compilers (`regex`, `json_schema`, `choice`)
//! build one with `GrammarBuilder`; `state` runs it.
//!
//! Repetition is right recursion (`R ::= x R | ε`), which the parser follows without growing
//! its stacks; text over characters becomes UTF-8 byte sequences, so a token's bytes (which may
//! end inside a character) are matched as they are.

use crate::error::GrammarError;
use regex_syntax::utf8::Utf8Sequences;

pub type RuleId = u32;

/// The most elements a grammar may have: what the compilers build stays far below it, and a
/// schema or regex that would exceed it (a repetition count in the millions) is refused.
pub const MAX_ELEMENTS: usize = 500_000;

/// A set of bytes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct ByteSet([u64; 4]);

impl ByteSet {
    /// The bytes `lo..=hi`.
    pub fn range(lo: u8, hi: u8) -> Self {
        let mut set = Self::default();
        for b in lo..=hi {
            set.0[(b / 64) as usize] |= 1 << (b % 64);
        }
        set
    }

    pub fn byte(b: u8) -> Self {
        Self::range(b, b)
    }

    pub fn contains(&self, b: u8) -> bool {
        self.0[(b / 64) as usize] & (1 << (b % 64)) != 0
    }

    pub fn union(self, other: Self) -> Self {
        Self(std::array::from_fn(|i| self.0[i] | other.0[i]))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Element {
    /// One byte of the set.
    Bytes(ByteSet),
    /// Any alternative of the rule.
    Rule(RuleId),
}

/// Elements matched one after another.
pub type Seq = Vec<Element>;

/// A compiled grammar: its text is what its start rule matches.
#[derive(Debug)]
pub struct Grammar {
    pub(crate) rules: Vec<Vec<Seq>>,
    pub(crate) start: RuleId,
}

/// Builds a grammar rule by rule; every helper that makes a rule counts its elements against
/// `MAX_ELEMENTS`.
#[derive(Default)]
pub struct GrammarBuilder {
    rules: Vec<Option<Vec<Seq>>>,
    elements: usize,
}

impl GrammarBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A rule defined later with `define`, so that rules can refer to themselves.
    pub fn reserve(&mut self) -> RuleId {
        self.rules.push(None);
        (self.rules.len() - 1) as RuleId
    }

    pub fn define(&mut self, id: RuleId, alternatives: Vec<Seq>) -> Result<(), GrammarError> {
        self.elements += alternatives.iter().map(|a| a.len().max(1)).sum::<usize>();
        if self.elements > MAX_ELEMENTS {
            return Err(GrammarError::TooLarge(MAX_ELEMENTS));
        }
        self.rules[id as usize] = Some(alternatives);
        Ok(())
    }

    /// A new rule matching any of `alternatives`.
    pub fn rule(&mut self, alternatives: Vec<Seq>) -> Result<Element, GrammarError> {
        let id = self.reserve();
        self.define(id, alternatives)?;
        Ok(Element::Rule(id))
    }

    /// One element standing for `seq`: itself when it is one element, else a rule.
    pub fn unit(&mut self, seq: Seq) -> Result<Element, GrammarError> {
        match seq[..] {
            [one] => Ok(one),
            _ => self.rule(vec![seq]),
        }
    }

    /// The bytes of `text`, one after another.
    pub fn literal(text: &[u8]) -> Seq {
        text.iter().map(|&b| Element::Bytes(ByteSet::byte(b))).collect()
    }

    /// Exactly one of `texts`, as a trie of rules: texts that share a beginning share its
    /// rules, so a parse holds one stack per next byte however many texts there are.
    pub fn one_of(&mut self, texts: &[&[u8]]) -> Result<Element, GrammarError> {
        // The trie: each node's children by byte, and whether a text ends there.
        let mut children: Vec<Vec<(u8, usize)>> = vec![Vec::new()];
        let mut ends = vec![false];
        for text in texts {
            let mut node = 0;
            for &b in *text {
                node = match children[node].iter().find(|c| c.0 == b) {
                    Some(&(_, child)) => child,
                    None => {
                        children.push(Vec::new());
                        ends.push(false);
                        let child = children.len() - 1;
                        children[node].push((b, child));
                        child
                    }
                };
            }
            ends[node] = true;
        }
        // A rule per node, children first: they were made after their parents.
        let mut rules: Vec<Option<Element>> = vec![None; children.len()];
        for node in (0..children.len()).rev() {
            let mut alternatives: Vec<Seq> = children[node]
                .iter()
                .map(|&(b, child)| {
                    let mut seq = vec![Element::Bytes(ByteSet::byte(b))];
                    seq.extend(rules[child]);
                    seq
                })
                .collect();
            if ends[node] && !children[node].is_empty() {
                alternatives.push(Vec::new());
            }
            // A leaf adds nothing after its byte.
            rules[node] = match children[node].is_empty() {
                true => None,
                false => Some(self.rule(alternatives)?),
            };
        }
        match rules[0] {
            Some(root) => Ok(root),
            None => self.rule(vec![Vec::new()]),
        }
    }

    /// Any one character in the inclusive `ranges`, as its UTF-8 bytes (surrogates excluded).
    /// The multi-byte sequences are a trie of byte sets (`byte_trie`), so a parse holds one way
    /// per distinct first byte set rather than one per sequence: a Unicode class such as `\w`
    /// is about a thousand sequences.
    pub fn chars(&mut self, ranges: &[(char, char)]) -> Result<Element, GrammarError> {
        let mut ascii = ByteSet::default();
        let mut wider: Vec<Vec<ByteSet>> = Vec::new();
        for &(lo, hi) in ranges {
            for seq in Utf8Sequences::new(lo, hi) {
                match seq.as_slice() {
                    [one] => ascii = ascii.union(ByteSet::range(one.start, one.end)),
                    many => wider.push(many.iter().map(|r| ByteSet::range(r.start, r.end)).collect()),
                }
            }
        }
        if wider.is_empty() {
            return Ok(Element::Bytes(ascii));
        }
        // Sorted, so that sequences with one first set stand together whatever order (or
        // overlap) the ranges came in; sequences with one lead byte have one length, so no
        // rest is ever empty.
        wider.sort_unstable();
        wider.dedup();
        let mut alternatives = self.byte_trie(&wider)?;
        if ascii != ByteSet::default() {
            alternatives.push(vec![Element::Bytes(ascii)]);
        }
        self.rule(alternatives)
    }

    /// Alternatives matching exactly the byte set sequences `seqs` (sorted, distinct, each
    /// non-empty, those with one first set of one length): each run with the same first set
    /// shares it, and a rule for their rests.
    fn byte_trie(&mut self, seqs: &[Vec<ByteSet>]) -> Result<Vec<Seq>, GrammarError> {
        let mut alternatives = Vec::new();
        let mut from = 0;
        while from < seqs.len() {
            let first = seqs[from][0];
            let to = from + seqs[from..].iter().take_while(|s| s[0] == first).count();
            let mut alternative = vec![Element::Bytes(first)];
            let rests: Vec<Vec<ByteSet>> = seqs[from..to].iter().map(|s| s[1..].to_vec()).collect();
            match &rests[..] {
                [rest] => alternative.extend(rest.iter().map(|&set| Element::Bytes(set))),
                _ => {
                    let rest = self.byte_trie(&rests)?;
                    alternative.push(self.rule(rest)?);
                }
            }
            alternatives.push(alternative);
            from = to;
        }
        Ok(alternatives)
    }

    /// `seq` or nothing.
    pub fn optional(&mut self, seq: Seq) -> Result<Element, GrammarError> {
        self.rule(vec![seq, Vec::new()])
    }

    /// `seq` any number of times, none included.
    pub fn star(&mut self, seq: Seq) -> Result<Element, GrammarError> {
        let id = self.reserve();
        let mut again = seq;
        again.push(Element::Rule(id));
        self.define(id, vec![again, Vec::new()])?;
        Ok(Element::Rule(id))
    }

    /// `seq` at least `min` times and at most `max` (no limit when None).
    pub fn repeat(&mut self, seq: Seq, min: u32, max: Option<u32>) -> Result<Seq, GrammarError> {
        let unit = self.unit(seq)?;
        let extra = match max {
            Some(max) => max.saturating_sub(min) as usize,
            None => 0,
        };
        if min as usize + extra > MAX_ELEMENTS {
            return Err(GrammarError::TooLarge(MAX_ELEMENTS));
        }
        let mut out = vec![unit; min as usize];
        if max.is_none() {
            out.push(self.star(vec![unit])?);
            return Ok(out);
        }
        // Up to `extra` more: each optional copy holds the next.
        let mut tail: Option<Element> = None;
        for _ in 0..extra {
            let mut more = vec![unit];
            more.extend(tail);
            tail = Some(self.optional(more)?);
        }
        out.extend(tail);
        Ok(out)
    }

    /// An element matching what `grammar` matches, its rules copied into this one.
    pub fn embed(&mut self, grammar: Grammar) -> Result<Element, GrammarError> {
        let offset = self.rules.len() as RuleId;
        let moved = |e: Element| match e {
            Element::Rule(id) => Element::Rule(id + offset),
            bytes => bytes,
        };
        let ids: Vec<RuleId> = grammar.rules.iter().map(|_| self.reserve()).collect();
        for (id, alternatives) in ids.into_iter().zip(grammar.rules) {
            let alternatives = alternatives
                .into_iter()
                .map(|seq| seq.into_iter().map(moved).collect())
                .collect();
            self.define(id, alternatives)?;
        }
        Ok(Element::Rule(grammar.start + offset))
    }

    /// The grammar whose text is what `seq` matches.
    pub fn finish(mut self, seq: Seq) -> Result<Grammar, GrammarError> {
        let start = self.reserve();
        self.define(start, vec![seq])?;
        Ok(self.build(start))
    }

    /// The grammar whose text is what `start` matches.
    pub fn build(self, start: RuleId) -> Grammar {
        let rules = self
            .rules
            .into_iter()
            .map(|r| r.expect("every reserved rule is defined"))
            .collect();
        Grammar { rules, start }
    }
}

/// The characters outside `ranges`.
pub(crate) fn complement(mut ranges: Vec<(char, char)>) -> Vec<(char, char)> {
    ranges.sort_unstable();
    let mut out = Vec::new();
    let mut next = 0u32;
    for (lo, hi) in ranges {
        if lo as u32 > next {
            out.extend(chars_between(next, lo as u32 - 1));
        }
        next = next.max(hi as u32 + 1);
    }
    out.extend(chars_between(next, char::MAX as u32));
    out
}

/// The characters from `lo` to `hi` as a range, the surrogates (no characters) left out at
/// its ends; None if none are left.
fn chars_between(lo: u32, hi: u32) -> Option<(char, char)> {
    let lo = if (0xd800..0xe000).contains(&lo) { 0xe000 } else { lo };
    let hi = if (0xd800..0xe000).contains(&hi) { 0xd7ff } else { hi };
    (lo <= hi).then(|| char::from_u32(lo).zip(char::from_u32(hi))).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_complement_skips_the_surrogates() {
        assert_eq!(complement(vec![]), [('\0', char::MAX)]);
        assert_eq!(complement(vec![('\0', '\u{d7ff}')]), [('\u{e000}', char::MAX)]);
        assert_eq!(complement(vec![('\u{e000}', char::MAX)]), [('\0', '\u{d7ff}')]);
        assert_eq!(
            complement(vec![('b', 'c'), ('a', 'a')]),
            [('\0', '`'), ('d', char::MAX)]
        );
        assert_eq!(
            complement(['\0', 'b', 'c', '\u{D7FF}'].map(|c| (c, c)).to_vec()),
            [('\u{1}', 'a'), ('d', '\u{D7FE}'), ('\u{E000}', char::MAX)]
        );
        assert_eq!(complement(vec![(char::MAX, char::MAX)]), [('\0', '\u{10FFFE}')]);
    }
}

//! Free text watched for patterns: text in which some strings may not appear (`excludes`)
//! and others start a format (`dispatch`: a tool call's trigger, say), as rules of a grammar.
//!
//! The text is read by an Aho-Corasick automaton over the patterns' symbols: its states are
//! the patterns' prefixes, and a state is where the text's longest suffix that begins a
//! pattern ends. Each state that completes no pattern becomes a rule: the text may end there,
//! or go on by a symbol to the next state. A symbol that completes an excluded pattern has no
//! alternative; one that completes a dispatched pattern goes on into its format, then back
//! to free text or to the end. Characters that begin no pattern from a state lead back to the
//! start, all by one element; so do special tokens, where the text may hold them (else they
//! appear only where a pattern names them).

use crate::error::GrammarError;
use crate::grammar::{complement, ByteSet, Element, GrammarBuilder, RuleId, Seq, MAX_ELEMENTS};
use crate::structure::{Literal, Symbol};
use crate::vocabulary::SPECIAL_MARK;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Free text as `free_text` makes it.
pub(crate) struct FreeText<'a> {
    /// Patterns that never appear in it.
    pub excludes: &'a [Literal],
    /// Patterns each followed by its elements.
    pub dispatch: &'a [(Literal, Seq)],
    /// After a dispatched pattern's elements, free text again (else nothing more).
    pub again: bool,
    /// Whether any special token may appear in it, as a character may (else only as part of
    /// a pattern).
    pub any_token: bool,
}

/// What completing a pattern means.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Completes {
    Excluded,
    /// The dispatched pattern with this index.
    Dispatch(usize),
}

#[derive(Default)]
struct Node {
    children: BTreeMap<Symbol, usize>,
    fail: usize,
    /// The patterns that end here, those of shorter suffixes included.
    completes: Vec<Completes>,
}

/// The element matching `text`. Patterns must not be empty.
pub(crate) fn free_text(b: &mut GrammarBuilder, text: &FreeText) -> Result<Element, GrammarError> {
    let FreeText {
        excludes,
        dispatch,
        again,
        any_token,
    } = *text;
    let patterns = excludes.iter().map(|p| (p, Completes::Excluded)).chain(
        dispatch
            .iter()
            .enumerate()
            .map(|(i, (p, _))| (p, Completes::Dispatch(i))),
    );
    let nodes = automaton(patterns)?;
    let steps = steps(&nodes)?;
    let rules: Vec<Option<RuleId>> = nodes
        .iter()
        .map(|n| n.completes.is_empty().then(|| b.reserve()))
        .collect();
    let start = Element::Rule(rules[0].expect("no pattern is empty, so the start completes none"));
    let formats = dispatch
        .iter()
        .map(|(_, seq)| b.unit(seq.clone()))
        .collect::<Result<Vec<Element>, GrammarError>>()?;
    let mut other_chars_by_taken: HashMap<Vec<char>, Element> = HashMap::new();
    let mut other_tokens_by_taken: HashMap<Vec<u32>, Element> = HashMap::new();
    for (state, rule) in rules.iter().enumerate() {
        let Some(rule) = *rule else { continue };
        let mut alternatives: Vec<Seq> = vec![Vec::new()];
        let (mut stepping_chars, mut stepping_tokens) = (Vec::new(), Vec::new());
        for (&symbol, &next) in &steps[state] {
            match symbol {
                Symbol::Char(c) => stepping_chars.push(c),
                Symbol::Token(id) => stepping_tokens.push(id),
            }
            let head = GrammarBuilder::literal(&symbol.bytes());
            if let Some(next_rule) = rules[next] {
                alternatives.push([head, vec![Element::Rule(next_rule)]].concat());
                continue;
            }
            let completes = &nodes[next].completes;
            if completes.contains(&Completes::Excluded) {
                continue;
            }
            for &c in completes {
                let Completes::Dispatch(i) = c else { continue };
                let mut seq = [head.clone(), vec![formats[i]]].concat();
                if again {
                    seq.push(start);
                }
                alternatives.push(seq);
            }
        }
        let other = shared(&mut other_chars_by_taken, stepping_chars, |taken| {
            b.chars(&complement(taken.iter().map(|&c| (c, c)).collect()))
        })?;
        alternatives.push(vec![other, start]);
        if any_token {
            let other = shared(&mut other_tokens_by_taken, stepping_tokens, |taken| {
                other_tokens(b, taken)
            })?;
            alternatives.push(vec![other, start]);
        }
        b.define(rule, alternatives)?;
    }
    Ok(start)
}

/// The element `make` builds for `taken`, built once for each set of symbols taken: states
/// that step on the same ones share it (`made` remembers them).
fn shared<T: Eq + std::hash::Hash>(
    made: &mut HashMap<Vec<T>, Element>,
    taken: Vec<T>,
    make: impl FnOnce(&[T]) -> Result<Element, GrammarError>,
) -> Result<Element, GrammarError> {
    if let Some(&element) = made.get(&taken) {
        return Ok(element);
    }
    let element = make(&taken)?;
    made.insert(taken, element);
    Ok(element)
}

/// The patterns' trie with each node's failure link (the node of its longest proper suffix
/// in the trie) and the patterns it completes.
fn automaton<'a>(patterns: impl Iterator<Item = (&'a Literal, Completes)>) -> Result<Vec<Node>, GrammarError> {
    let mut nodes = vec![Node::default()];
    let mut symbols = 0usize;
    for (pattern, completes) in patterns {
        if pattern.0.is_empty() {
            return Err(GrammarError::Structure("a pattern in free text is empty".into()));
        }
        symbols += pattern.0.len();
        if symbols > MAX_ELEMENTS {
            return Err(GrammarError::TooLarge(MAX_ELEMENTS));
        }
        let mut node = 0;
        for &symbol in &pattern.0 {
            node = match nodes[node].children.get(&symbol) {
                Some(&child) => child,
                None => {
                    nodes.push(Node::default());
                    let child = nodes.len() - 1;
                    nodes[node].children.insert(symbol, child);
                    child
                }
            };
        }
        nodes[node].completes.push(completes);
    }
    // Breadth first, so that a node's failure (shallower) is done before it.
    let mut queue: VecDeque<usize> = nodes[0].children.values().copied().collect();
    while let Some(node) = queue.pop_front() {
        let children: Vec<(Symbol, usize)> = nodes[node].children.iter().map(|(&s, &c)| (s, c)).collect();
        for (symbol, child) in children {
            let mut fail = nodes[node].fail;
            let suffix = loop {
                if let Some(&next) = nodes[fail].children.get(&symbol) {
                    break next;
                }
                if fail == 0 {
                    break 0;
                }
                fail = nodes[fail].fail;
            };
            nodes[child].fail = suffix;
            let inherited = nodes[suffix].completes.clone();
            nodes[child].completes.extend(inherited);
            queue.push_back(child);
        }
    }
    Ok(nodes)
}

/// Each state's steps that lead anywhere but the start, by symbol: its children, and where
/// its failure's steps lead for the other symbols. Each becomes an alternative, so there may
/// be no more of them than a grammar has elements (checked as they are made: many patterns
/// that begin alike would make states times patterns of them).
fn steps(nodes: &[Node]) -> Result<Vec<BTreeMap<Symbol, usize>>, GrammarError> {
    let mut steps: Vec<BTreeMap<Symbol, usize>> = vec![BTreeMap::new(); nodes.len()];
    steps[0] = nodes[0].children.clone();
    let mut made = steps[0].len();
    let mut queue: VecDeque<usize> = nodes[0].children.values().copied().collect();
    while let Some(node) = queue.pop_front() {
        let mut own = steps[nodes[node].fail].clone();
        own.extend(nodes[node].children.iter().map(|(&s, &c)| (s, c)));
        made += own.len();
        if made > MAX_ELEMENTS {
            return Err(GrammarError::TooLarge(MAX_ELEMENTS));
        }
        steps[node] = own;
        queue.extend(nodes[node].children.values());
    }
    Ok(steps)
}

/// Any special token's spelling but those of `taken` (sorted): the mark, then three bytes of
/// an id outside them.
fn other_tokens(b: &mut GrammarBuilder, taken: &[u32]) -> Result<Element, GrammarError> {
    const LAST_ID: u32 = 0xFF_FFFF;
    let mut ranges = Vec::new();
    let mut from = 0;
    for &id in taken {
        if from < id {
            ranges.push((from, id - 1));
        }
        from = id + 1;
    }
    if from <= LAST_ID {
        ranges.push((from, LAST_ID));
    }
    let mark = Element::Bytes(ByteSet::byte(SPECIAL_MARK));
    let mut alternatives = Vec::new();
    for (lo, hi) in ranges {
        let (lo, hi) = (&lo.to_be_bytes()[1..], &hi.to_be_bytes()[1..]);
        for bytes in byte_ranges(lo, hi) {
            let mut seq = vec![mark];
            seq.extend(bytes.into_iter().map(|(l, h)| Element::Bytes(ByteSet::range(l, h))));
            alternatives.push(seq);
        }
    }
    b.rule(alternatives)
}

/// The byte strings from `lo` to `hi` (as big-endian numbers of their equal length) as
/// sequences of byte ranges, one byte range a position: whole ranges in the middle, and the
/// ends split where they are not.
fn byte_ranges(lo: &[u8], hi: &[u8]) -> Vec<Vec<(u8, u8)>> {
    let (Some((&l, lo_rest)), Some((&h, hi_rest))) = (lo.split_first(), hi.split_first()) else {
        return vec![Vec::new()];
    };
    let with =
        |first: (u8, u8), rests: Vec<Vec<(u8, u8)>>| rests.into_iter().map(move |rest| [vec![first], rest].concat());
    if l == h {
        return with((l, l), byte_ranges(lo_rest, hi_rest)).collect();
    }
    let (zeros, ones) = (vec![0u8; lo_rest.len()], vec![0xFFu8; hi_rest.len()]);
    let mut out = Vec::new();
    let whole_from = match lo_rest == zeros.as_slice() {
        true => l,
        false => {
            out.extend(with((l, l), byte_ranges(lo_rest, &ones)));
            l + 1
        }
    };
    let whole_to = match hi_rest == ones.as_slice() {
        true => h,
        false => h - 1,
    };
    if whole_from <= whole_to {
        out.extend(with((whole_from, whole_to), vec![vec![(0, 0xFF); lo_rest.len()]]));
    }
    if hi_rest != ones.as_slice() {
        out.extend(with((h, h), byte_ranges(&zeros, hi_rest)));
    }
    out
}

#[cfg(test)]
#[path = "free_text_tests.rs"]
mod tests;

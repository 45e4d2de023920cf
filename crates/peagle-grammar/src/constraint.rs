//! A compiled constraint on a request's text: its grammar, the model's vocabulary, and the
//! tokens each parse state allows, remembered per state (a JSON string's inside, say, is one
//! state however long the string runs), so the vocabulary is walked once per state met.
//!
//! The walk steps through the parse one byte at a time for every edge of the vocabulary's
//! trie. Each state met is numbered and its step by each byte remembered (`Transitions`, the
//! parser's states turned into a DFA as they are met): most of a walk's edges lead back to a
//! few states (the inside of a string), so most steps are a table lookup.

use crate::grammar::Grammar;
use crate::state::State;
use crate::vocabulary::Vocabulary;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// The most memory the remembered states' tokens may take (a bit per token each); past it the
/// memory starts over.
const REMEMBERED_BYTES: usize = 8 << 20;
/// The most states numbered for the walks (a 1 KiB row of steps each). A walk that meets
/// more steps through the others by the parser alone, and the numbering starts over before
/// the next walk.
const NUMBERED_STATES: usize = 2048;

pub struct Constraint {
    grammar: Grammar,
    vocab: Arc<Vocabulary>,
    masks: Mutex<HashMap<State, Arc<TokenMask>>>,
    transitions: Mutex<Transitions>,
}

/// The parse states met by walks, numbered, and each one's step by each byte as far as
/// taken. State 0 is the dead state.
struct Transitions {
    states: Vec<State>,
    numbers: HashMap<State, u32>,
    steps: Vec<[u32; 256]>,
}

/// A step not yet taken.
const UNKNOWN: u32 = u32::MAX;
const DEAD: u32 = 0;

impl Transitions {
    fn new() -> Self {
        let mut t = Self {
            states: Vec::new(),
            numbers: HashMap::new(),
            steps: Vec::new(),
        };
        t.number(State::dead());
        t
    }

    fn number(&mut self, state: State) -> u32 {
        if let Some(&n) = self.numbers.get(&state) {
            return n;
        }
        let n = self.states.len() as u32;
        self.numbers.insert(state.clone(), n);
        self.states.push(state);
        self.steps.push([UNKNOWN; 256]);
        n
    }

    /// Where `byte` leads from `at`; None where no text goes on.
    fn step(&mut self, grammar: &Grammar, at: &At, byte: u8) -> Option<At> {
        let n = match at {
            At::Numbered(n) => *n,
            At::Unnumbered(state) => {
                let next = grammar.advance(state, byte);
                return (!next.is_dead()).then(|| self.at(next));
            }
        };
        let known = self.steps[n as usize][byte as usize];
        if known != UNKNOWN {
            return (known != DEAD).then_some(At::Numbered(known));
        }
        let next = grammar.advance(&self.states[n as usize], byte);
        if next.is_dead() {
            self.steps[n as usize][byte as usize] = DEAD;
            return None;
        }
        let next = self.at(next);
        if let At::Numbered(m) = next {
            self.steps[n as usize][byte as usize] = m;
        }
        Some(next)
    }

    /// `state` numbered, if it is or there is room for it.
    fn at(&mut self, state: State) -> At {
        match self.numbers.get(&state) {
            Some(&n) => At::Numbered(n),
            None if self.states.len() < NUMBERED_STATES => At::Numbered(self.number(state)),
            None => At::Unnumbered(state),
        }
    }
}

/// Where a walk is: a numbered state, or one met past the numbering's room.
enum At {
    Numbered(u32),
    Unnumbered(State),
}

/// The tokens a state allows: those whose bytes continue its text.
pub struct TokenMask {
    bits: Vec<u64>,
    len: usize,
}

impl TokenMask {
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.len && self.bits[token as usize / 64] & (1 << (token % 64)) != 0
    }

    /// The mask as bits: bit `t % 64` of word `t / 64` allows token `t`; no token past the
    /// vocabulary is.
    pub fn bits(&self) -> &[u64] {
        &self.bits
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }
}

impl Constraint {
    pub fn new(grammar: Grammar, vocab: Arc<Vocabulary>) -> Self {
        Self {
            grammar,
            vocab,
            masks: Mutex::new(HashMap::new()),
            transitions: Mutex::new(Transitions::new()),
        }
    }

    /// The state before any token.
    pub fn start(&self) -> State {
        self.grammar.start()
    }

    /// The state after `token` follows `state`: its text, or its special spelling, which only a
    /// grammar that names it takes; an id past the vocabulary leaves no text.
    pub fn advance(&self, state: &State, token: u32) -> State {
        match self.vocab.bytes(token) {
            Some(bytes) => self.grammar.advance_bytes(state, bytes),
            None => State::dead(),
        }
    }

    /// The tokens `state` allows.
    pub fn allowed(&self, state: &State) -> Arc<TokenMask> {
        if let Some(mask) = self.masks.lock().expect("no panic holds the lock").get(state) {
            return mask.clone();
        }
        let mask = Arc::new(self.walk(state));
        let mut masks = self.masks.lock().expect("no panic holds the lock");
        // A remembered state costs its mask and its key (a position is 12 bytes).
        let cost = |state: &State| self.vocab.len().div_ceil(8) + 12 * state.positions();
        let held: usize = masks.keys().map(cost).sum();
        if held + cost(state) > REMEMBERED_BYTES {
            masks.clear();
        }
        masks.insert(state.clone(), mask.clone());
        mask
    }

    /// Walks the vocabulary's trie from `state` in preorder, past each subtree whose first
    /// byte no text takes.
    fn walk(&self, state: &State) -> TokenMask {
        let len = self.vocab.len();
        let trie = self.vocab.trie();
        let mut bits = vec![0u64; len.div_ceil(64)];
        let mut transitions = self.transitions.lock().expect("no panic holds the lock");
        if transitions.states.len() >= NUMBERED_STATES {
            *transitions = Transitions::new();
        }
        // Where the text stands after each depth of the way to the node at hand: `ways[d]`
        // after its first d bytes. Node i's parent is at depth(i) - 1, so the ways past it
        // belong to nodes already left.
        let mut ways = Vec::with_capacity(trie.max_depth() + 1);
        ways.push(transitions.at(state.clone()));
        let mut node = 0;
        while node < trie.len() {
            let depth = trie.depth(node);
            ways.truncate(depth);
            match transitions.step(&self.grammar, &ways[depth - 1], trie.byte(node)) {
                None => node = trie.end(node),
                Some(next) => {
                    for &t in trie.tokens(node) {
                        bits[t as usize / 64] |= 1 << (t % 64);
                    }
                    ways.push(next);
                    node += 1;
                }
            }
        }
        TokenMask { bits, len }
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint")
            .field("vocab", &self.vocab.len())
            .finish_non_exhaustive()
    }
}

/// Constraints are equal when they are the same compiled constraint.
impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_schema::schema_grammar;
    use crate::spec::Spec;
    use serde_json::json;

    /// Each allowed token is one whose bytes the grammar takes from the state, and each
    /// banned one is not, checked token by token against the parser on every state of a
    /// JSON text's way.
    #[test]
    fn a_state_allows_exactly_the_tokens_its_text_may_go_on_with() {
        let pieces = [
            "{", "}", "\"", "\"a", "a", "b\"", ":", ": ", " ", "1", "12", "true", "tr", "\n", ",", "\"b\": ", "}\n",
            "é", "\u{e9}",
        ];
        let mut tokens: Vec<Option<Vec<u8>>> = pieces.iter().map(|p| Some(p.as_bytes().to_vec())).collect();
        tokens.push(Some(vec![0xc3]));
        tokens.push(Some(vec![0xa9, b'"']));
        tokens.push(None);
        let vocab = Arc::new(Vocabulary::new(tokens));
        let schema = json!({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "string"}}, "required": ["a"]});
        let constraint = Constraint::new(schema_grammar(&schema, None).unwrap(), vocab.clone());
        let text = "{\"a\": true, \"b\": \"é\u{e9}\"}";
        let mut state = constraint.start();
        for (i, byte) in text.bytes().enumerate() {
            let mask = constraint.allowed(&state);
            for t in 0..vocab.len() as u32 {
                let fits = vocab
                    .bytes(t)
                    .is_some_and(|b| !constraint.grammar.advance_bytes(&state, b).is_dead());
                assert_eq!(mask.allows(t), fits, "after {:?}, token {t}", &text[..i]);
            }
            state = constraint.grammar.advance(&state, byte);
        }
        assert!(state.accepts() && state.is_final());
        assert_eq!(constraint.allowed(&state).count(), 0);
        assert!(
            constraint
                .advance(&constraint.start(), vocab.len() as u32 - 1)
                .is_dead(),
            "not text"
        );
    }

    /// Random patterns over a random vocabulary (tokens of one to four characters, lone UTF-8
    /// bytes that split a character, and tokens that are no text): along walks of tokens
    /// drawn from each mask, every state's mask allows exactly the tokens whose bytes the
    /// grammar takes from it.
    #[test]
    fn random_patterns_allow_exactly_the_tokens_that_fit() {
        use crate::random_patterns::{Node, ALPHABET};
        use rand::rngs::StdRng;
        use rand::seq::IndexedRandom;
        use rand::{Rng, SeedableRng};
        let mut r = StdRng::seed_from_u64(20261203);
        let mut tokens: Vec<Option<Vec<u8>>> = (0..300)
            .map(|_| {
                let text: String = (0..r.random_range(1..=4))
                    .map(|_| *ALPHABET.choose(&mut r).unwrap())
                    .collect();
                Some(text.into_bytes())
            })
            .collect();
        tokens.extend([0xC3, 0xA9, 0xE6, 0x97, 0xA5, 0xF0, 0x9D, 0x84, 0x9E].map(|b| Some(vec![b])));
        tokens.extend([None, None]);
        let vocab = Arc::new(Vocabulary::new(tokens));
        let mut steps = 0;
        for _ in 0..100 {
            let pattern = Node::draw(&mut r, 3).pattern();
            let constraint = Constraint::new(Spec::Regex(pattern.clone()).compile(&vocab).unwrap(), vocab.clone());
            let mut state = constraint.start();
            for _ in 0..8 {
                let mask = constraint.allowed(&state);
                let mut allowed = Vec::new();
                for t in 0..vocab.len() as u32 {
                    let fits = !constraint.advance(&state, t).is_dead();
                    assert_eq!(mask.allows(t), fits, "{pattern:?}, token {t}: {:?}", vocab.bytes(t));
                    allowed.extend(fits.then_some(t));
                }
                steps += 1;
                let Some(&t) = allowed.choose(&mut r) else { break };
                state = constraint.advance(&state, t);
            }
        }
        assert!(steps > 200, "{steps} masks checked");
    }

    /// A walk that meets more states than are numbered (one per byte of a 3000-byte token
    /// here) steps through the rest by the parser, with the same answer.
    #[test]
    fn a_walk_past_the_numbered_states_allows_the_same_tokens() {
        let tokens = [
            "a".repeat(3000),
            "a".repeat(2500) + "b",
            "b".into(),
            "a".repeat(5001),
            "c".into(),
        ];
        let vocab = Arc::new(Vocabulary::new(
            tokens.iter().map(|t| Some(t.as_bytes().to_vec())).collect(),
        ));
        let constraint = Constraint::new(Spec::Regex("a{0,5000}b".into()).compile(&vocab).unwrap(), vocab);
        let mask = constraint.allowed(&constraint.start());
        let allowed: Vec<u32> = (0..5).filter(|&t| mask.allows(t)).collect();
        assert_eq!(allowed, [0, 1, 2]);
        assert!(constraint.transitions.lock().unwrap().states.len() <= NUMBERED_STATES);
    }
}

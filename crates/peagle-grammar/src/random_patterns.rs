//! Regular expressions drawn at random for tests: a tree that renders as a pattern (Rust's
//! regex syntax), and where it can as a GBNF grammar of the same language, and draws texts the
//! pattern likely matches; and one-character mutations of texts, over an alphabet that
//! reaches UTF-8's and case folding's corners.

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;

/// A pattern drawn at random, as a tree, so that texts it likely matches can be drawn too.
pub(crate) enum Node {
    Literal(char),
    /// A bracketed class, `.`, `\d`, `\w` or `\s`: one character of those `ALPHABET` has
    /// that the regex crate puts in it (`members`), drawn from for texts. A bracketed one
    /// keeps its ranges and whether it is negated, for GBNF.
    Class {
        pattern: String,
        members: Vec<char>,
        bracket: Option<(bool, Vec<(char, char)>)>,
    },
    Concat(Vec<Node>),
    Alternation(Vec<Node>),
    Repetition {
        sub: Box<Node>,
        min: u32,
        max: Option<u32>,
        lazy: bool,
    },
    Group {
        sub: Box<Node>,
        capture: bool,
    },
    CaseInsensitive(Box<Node>),
}

/// The characters patterns and texts are made of: ASCII letters, digits and punctuation,
/// JSON's specials and control characters, and characters of two, three and four UTF-8 bytes,
/// some with case folds outside ASCII (the Kelvin sign folds with k, ſ with s).
pub(crate) const ALPHABET: [char; 22] = [
    'a', 'b', 'k', 's', 'A', 'K', 'x', '1', '9', '-', '.', '_', ' ', '\n', '\t', '"', '\\', 'é', 'ſ', '\u{212A}', '日',
    '𝄞',
];

impl Node {
    pub(crate) fn draw(r: &mut StdRng, depth: u32) -> Node {
        let leaf = depth == 0 || r.random_bool(0.35);
        if leaf {
            return match r.random_range(0..3) {
                0 => Node::Literal(*ALPHABET.choose(r).unwrap()),
                _ => Node::class(r),
            };
        }
        let subs = |r: &mut StdRng| (0..r.random_range(2..=3)).map(|_| Node::draw(r, depth - 1)).collect();
        match r.random_range(0..5) {
            0 => Node::Concat(subs(r)),
            1 => Node::Alternation(subs(r)),
            2 => {
                let (min, max) = match r.random_range(0..6) {
                    0 => (0, Some(1)),
                    1 => (0, None),
                    2 => (1, None),
                    3 => (2, Some(2)),
                    4 => (1, Some(3)),
                    _ => (2, None),
                };
                let sub = Box::new(Node::draw(r, depth - 1));
                Node::Repetition {
                    sub,
                    min,
                    max,
                    lazy: r.random_bool(0.2),
                }
            }
            3 => Node::Group {
                sub: Box::new(Node::draw(r, depth - 1)),
                capture: r.random_bool(0.5),
            },
            _ => Node::CaseInsensitive(Box::new(Node::draw(r, depth - 1))),
        }
    }

    fn class(r: &mut StdRng) -> Node {
        let (pattern, bracket) = match r.random_range(0..6) {
            0 => (".".to_string(), None),
            1 => (r"\d".to_string(), None),
            2 => (r"\w".to_string(), None),
            3 => (r"\s".to_string(), None),
            _ => {
                let negated = r.random_bool(0.3);
                let ranges: Vec<(char, char)> = (0..r.random_range(1..=3))
                    .map(|_| {
                        let mut pair = [*ALPHABET.choose(r).unwrap(), *ALPHABET.choose(r).unwrap()];
                        pair.sort();
                        match r.random_bool(0.4) {
                            true => (pair[0], pair[1]),
                            false => (pair[0], pair[0]),
                        }
                    })
                    .collect();
                let items: String = ranges.iter().map(|&r| class_range(r, class_char)).collect();
                let pattern = format!("[{}{items}]", if negated { "^" } else { "" });
                (pattern, Some((negated, ranges)))
            }
        };
        let one = ::regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
        let members = ALPHABET
            .iter()
            .copied()
            .filter(|c| one.is_match(&c.to_string()))
            .collect();
        Node::Class {
            pattern,
            members,
            bracket,
        }
    }

    /// The tree as a GBNF expression, its capture groups as rules of their own (pushed onto
    /// `rules`, `name ::= body`); None where GBNF has no equal (`.`, which takes a newline in
    /// GBNF, Perl classes, case folding).
    pub(crate) fn gbnf(&self, rules: &mut Vec<String>) -> Option<String> {
        Some(match self {
            Node::Literal(c) => format!("\"{}\"", gbnf_char(*c)),
            Node::Class { bracket: None, .. } | Node::CaseInsensitive(_) => return None,
            Node::Class {
                bracket: Some((negated, ranges)),
                ..
            } => {
                let items: String = ranges.iter().map(|&r| class_range(r, gbnf_char)).collect();
                format!("[{}{items}]", if *negated { "^" } else { "" })
            }
            Node::Concat(subs) => subs
                .iter()
                .map(|s| s.gbnf(rules))
                .collect::<Option<Vec<_>>>()?
                .join(" "),
            Node::Alternation(subs) => {
                let subs = subs.iter().map(|s| s.gbnf(rules)).collect::<Option<Vec<_>>>()?;
                format!("({})", subs.join(" | "))
            }
            Node::Repetition { sub, min, max, .. } => {
                format!("({}){}", sub.gbnf(rules)?, counts(*min, *max))
            }
            Node::Group { sub, capture: false } => format!("({})", sub.gbnf(rules)?),
            Node::Group { sub, capture: true } => {
                let body = sub.gbnf(rules)?;
                let name = format!("group-{}", rules.len());
                rules.push(format!("{name} ::= {body}"));
                name
            }
        })
    }

    /// `n` texts drawn to match, each followed by a one-character mutation of it.
    pub(crate) fn texts(&self, r: &mut StdRng, n: usize) -> Vec<String> {
        let mut texts = Vec::with_capacity(2 * n);
        for _ in 0..n {
            let mut text = String::new();
            self.sample(r, &mut text);
            texts.push(mutated(r, &text));
            texts.push(text);
        }
        texts
    }

    pub(crate) fn pattern(&self) -> String {
        match self {
            Node::Literal(c) => regex_syntax::escape(&c.to_string()),
            Node::Class { pattern, .. } => pattern.clone(),
            Node::Concat(subs) => subs.iter().map(Node::pattern).collect(),
            Node::Alternation(subs) => {
                format!("(?:{})", subs.iter().map(Node::pattern).collect::<Vec<_>>().join("|"))
            }
            Node::Repetition { sub, min, max, lazy } => {
                let lazy = if *lazy { "?" } else { "" };
                format!("(?:{}){}{lazy}", sub.pattern(), counts(*min, *max))
            }
            Node::Group { sub, capture: true } => format!("({})", sub.pattern()),
            Node::Group { sub, capture: false } => format!("(?:{})", sub.pattern()),
            Node::CaseInsensitive(sub) => format!("(?i:{})", sub.pattern()),
        }
    }

    /// A text the pattern likely matches (a case-insensitive part's letters flipped at random,
    /// a class with no member of the alphabet drawn as any character).
    pub(crate) fn sample(&self, r: &mut StdRng, out: &mut String) {
        match self {
            Node::Literal(c) => out.push(*c),
            Node::Class { members, .. } => out.push(*members.choose(r).unwrap_or(&'a')),
            Node::Concat(subs) => subs.iter().for_each(|s| s.sample(r, out)),
            Node::Alternation(subs) => subs.choose(r).unwrap().sample(r, out),
            Node::Repetition { sub, min, max, .. } => {
                let n = r.random_range(*min..=max.unwrap_or(min + 3));
                (0..n).for_each(|_| sub.sample(r, out));
            }
            Node::Group { sub, .. } => sub.sample(r, out),
            Node::CaseInsensitive(sub) => {
                let mut inner = String::new();
                sub.sample(r, &mut inner);
                for c in inner.chars() {
                    match r.random_bool(0.5) {
                        true => out.extend(c.to_uppercase()),
                        false => out.push(c),
                    }
                }
            }
        }
    }
}

/// A repetition's counts, written alike in both syntaxes.
fn counts(min: u32, max: Option<u32>) -> String {
    match (min, max) {
        (0, Some(1)) => "?".to_string(),
        (0, None) => "*".to_string(),
        (1, None) => "+".to_string(),
        (m, Some(n)) if m == n => format!("{{{m}}}"),
        (m, None) => format!("{{{m},}}"),
        (m, Some(n)) => format!("{{{m},{n}}}"),
    }
}

/// A character as it stands inside a bracketed class.
fn class_char(c: char) -> String {
    match c {
        '\n' => r"\n".into(),
        '\t' => r"\t".into(),
        c if "\\^-[]&~".contains(c) => format!("\\{c}"),
        c => c.to_string(),
    }
}

/// A character as it stands in a GBNF literal or class: escaped where it would end or open
/// either, or is a control character or a class's `^`.
fn gbnf_char(c: char) -> String {
    match c {
        '\n' => r"\n".into(),
        '\t' => r"\t".into(),
        '"' | '\\' | ']' | '-' => format!("\\{c}"),
        '^' => r"\x5E".into(),
        c => c.to_string(),
    }
}

/// A class's range `(lo, hi)` with its characters as `spell` writes them.
fn class_range((lo, hi): (char, char), spell: fn(char) -> String) -> String {
    match lo == hi {
        true => spell(lo),
        false => format!("{}-{}", spell(lo), spell(hi)),
    }
}

/// `text` with one character inserted, removed or replaced at random.
fn mutated(r: &mut StdRng, text: &str) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let at = r.random_range(0..=chars.len());
    let other = *ALPHABET.choose(r).unwrap();
    let last = chars.len().saturating_sub(1);
    match r.random_range(0..3) {
        0 => chars.insert(at, other),
        _ if chars.is_empty() => {}
        1 => {
            chars.remove(at.min(last));
        }
        _ => chars[at.min(last)] = other,
    }
    chars.into_iter().collect()
}

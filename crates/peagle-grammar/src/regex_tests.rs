//! The regex compiler's tests: patterns against the regex crate's own engine, chosen and
//! drawn at random, raw and inside a JSON string.

use super::*;
use crate::grammar::Grammar;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

fn grammar(pattern: &str, chars: Chars) -> Result<Grammar, GrammarError> {
    let mut b = GrammarBuilder::new();
    let seq = compile(&mut b, pattern, chars)?;
    b.finish(seq)
}

fn matches(g: &Grammar, text: &str) -> bool {
    g.advance_bytes(&g.start(), text.as_bytes()).accepts()
}

/// Each pattern against texts it matches and texts it does not, as the regex crate's own
/// engine decides for the whole text.
#[test]
fn patterns_match_what_the_regex_crate_matches_whole() {
    let cases: &[(&str, &[&str])] = &[
        (
            r"[0-9]{3}-[0-9]{4}",
            &["555-1234", "55-1234", "5555-123", "555-12345", ""],
        ),
        (r"^(cat|dog)s?$", &["cat", "dogs", "cats", "cow", "catss", ""]),
        (r"a(b|c)*d+", &["ad", "abcbcddd", "a", "abd", "bd"]),
        (r"\d+(\.\d{1,2})?", &["3", "3.14", "3.141", "3.", ".5"]),
        (r"[^a-c]x", &["dx", "ax", "日x", "\nx"]),
        (r"(?i)yes|no", &["YES", "No", "maybe"]),
        (r"\w+@\w+\.com", &["me@example.com", "me@.com", "@x.com"]),
        (r"x{2,}y?", &["x", "xx", "xxxxy", "xyy"]),
        (r"", &["", "a"]),
    ];
    for &(pattern, texts) in cases {
        let g = grammar(pattern, Chars::Raw).unwrap();
        let whole = regex_syntax::ParserBuilder::new().build().parse(pattern).unwrap();
        let reference = regex::Regex::new(&format!("^(?:{whole})$")).unwrap();
        for text in texts {
            assert_eq!(matches(&g, text), reference.is_match(text), "{pattern} on {text:?}");
        }
    }
}

#[test]
fn inside_a_json_string_specials_are_escaped() {
    let g = grammar(r#"a"b\\c[\n\x1f]"#, Chars::InJsonString).unwrap();
    for text in [r#"a\"b\\c\n"#, r#"a\"b\\c\u001f"#, r#"a\"b\\c\u001F"#] {
        assert!(matches(&g, text), "{text}");
    }
    assert!(!matches(&g, "a\"b\\c\n"), "raw specials are not JSON");
}

#[test]
fn unsupported_patterns_are_refused() {
    assert!(matches!(
        grammar(r"a\bb", Chars::Raw),
        Err(GrammarError::RegexFeature(_))
    ));
    assert_eq!(
        grammar(r"ab(", Chars::Raw).unwrap_err(),
        GrammarError::Regex("unclosed group at offset 2".into())
    );
    assert!(matches!(
        grammar(r"a{1000000}", Chars::Raw),
        Err(GrammarError::Regex(_) | GrammarError::TooLarge(_))
    ));
}

/// A pattern drawn at random, as a tree, so that texts it likely matches can be drawn too.
enum Node {
    Literal(char),
    /// A bracketed class, `.`, `\d`, `\w` or `\s`: one character of those `ALPHABET` has
    /// that the regex crate puts in it (`members`), drawn from for texts.
    Class {
        pattern: String,
        members: Vec<char>,
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
const ALPHABET: [char; 22] = [
    'a', 'b', 'k', 's', 'A', 'K', 'x', '1', '9', '-', '.', '_', ' ', '\n', '\t', '"', '\\', 'é', 'ſ', '\u{212A}', '日',
    '𝄞',
];

impl Node {
    fn draw(r: &mut StdRng, depth: u32) -> Node {
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
        let pattern = match r.random_range(0..6) {
            0 => ".".to_string(),
            1 => r"\d".to_string(),
            2 => r"\w".to_string(),
            3 => r"\s".to_string(),
            _ => {
                let negated = if r.random_bool(0.3) { "^" } else { "" };
                let items: String = (0..r.random_range(1..=3))
                    .map(|_| {
                        let mut pair = [*ALPHABET.choose(r).unwrap(), *ALPHABET.choose(r).unwrap()];
                        pair.sort();
                        match r.random_bool(0.4) {
                            true => format!("{}-{}", class_char(pair[0]), class_char(pair[1])),
                            false => class_char(pair[0]),
                        }
                    })
                    .collect();
                format!("[{negated}{items}]")
            }
        };
        let one = ::regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
        let members = ALPHABET
            .iter()
            .copied()
            .filter(|c| one.is_match(&c.to_string()))
            .collect();
        Node::Class { pattern, members }
    }

    fn pattern(&self) -> String {
        match self {
            Node::Literal(c) => regex_syntax::escape(&c.to_string()),
            Node::Class { pattern, .. } => pattern.clone(),
            Node::Concat(subs) => subs.iter().map(Node::pattern).collect(),
            Node::Alternation(subs) => {
                format!("(?:{})", subs.iter().map(Node::pattern).collect::<Vec<_>>().join("|"))
            }
            Node::Repetition { sub, min, max, lazy } => {
                let bounds = match (min, max) {
                    (0, Some(1)) => "?".to_string(),
                    (0, None) => "*".to_string(),
                    (1, None) => "+".to_string(),
                    (m, Some(n)) if m == n => format!("{{{m}}}"),
                    (m, None) => format!("{{{m},}}"),
                    (m, Some(n)) => format!("{{{m},{n}}}"),
                };
                format!("(?:{}){bounds}{}", sub.pattern(), if *lazy { "?" } else { "" })
            }
            Node::Group { sub, capture: true } => format!("({})", sub.pattern()),
            Node::Group { sub, capture: false } => format!("(?:{})", sub.pattern()),
            Node::CaseInsensitive(sub) => format!("(?i:{})", sub.pattern()),
        }
    }

    /// A text the pattern likely matches (a case-insensitive part's letters flipped at random,
    /// a class with no member of the alphabet drawn as any character).
    fn sample(&self, r: &mut StdRng, out: &mut String) {
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

/// A character as it stands inside a bracketed class.
fn class_char(c: char) -> String {
    match c {
        '\n' => r"\n".into(),
        '\t' => r"\t".into(),
        c if "\\^-[]&~".contains(c) => format!("\\{c}"),
        c => c.to_string(),
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

/// Patterns drawn at random, and for each texts drawn to match it and their one-character
/// mutations: the grammar takes a text exactly when the regex crate matches it whole, and,
/// compiled for the inside of a JSON string, takes the text's JSON escaping (serde_json's)
/// exactly then too.
#[test]
fn random_patterns_match_what_the_regex_crate_matches_whole() {
    let mut r = StdRng::seed_from_u64(20261203);
    let (mut checked, mut matched) = (0, 0);
    for _ in 0..300 {
        let node = Node::draw(&mut r, 3);
        let pattern = node.pattern();
        let reference = ::regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
        let raw = grammar(&pattern, Chars::Raw).unwrap_or_else(|e| panic!("{pattern:?}: {e}"));
        let in_json = grammar(&pattern, Chars::InJsonString).unwrap();
        for _ in 0..10 {
            let mut text = String::new();
            node.sample(&mut r, &mut text);
            for text in [mutated(&mut r, &text), text] {
                let whole = reference.is_match(&text);
                assert_eq!(matches(&raw, &text), whole, "{pattern:?} on {text:?}");
                let escaped = serde_json::to_string(&text).unwrap();
                let escaped = &escaped[1..escaped.len() - 1];
                assert_eq!(matches(&in_json, escaped), whole, "{pattern:?} in JSON on {escaped:?}");
                checked += 1;
                matched += whole as usize;
            }
        }
    }
    // Both answers are tested often.
    assert!(
        matched * 4 > checked && matched * 4 < 3 * checked,
        "{matched} of {checked}"
    );
}

/// A Unicode class is about a thousand UTF-8 sequences, which share their first bytes' rules:
/// a parse holds a way per first byte set, not per sequence, so repeating and alternating such
/// classes stays within what a state holds (this pattern once lost every way after its first
/// byte).
#[test]
fn unicode_classes_keep_parses_narrow() {
    let word = grammar(r"\w", Chars::Raw).unwrap();
    assert!(word.start().stacks_len() < 64, "{}", word.start().stacks_len());
    let g = grammar(r"(?:.*|\w|\w){2,}", Chars::Raw).unwrap();
    for text in ["\"k1s", "日本", "", "\u{1F600}x"] {
        assert!(matches(&g, text), "{text:?}");
    }
    assert!(!matches(&g, "a\nb"));
}

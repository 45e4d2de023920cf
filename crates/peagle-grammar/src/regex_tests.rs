//! The regex compiler's tests: patterns against the regex crate's own engine, chosen and
//! drawn at random, raw and inside a JSON string.

use super::*;
use crate::grammar::Grammar;
use crate::random_patterns::Node;
use rand::rngs::StdRng;
use rand::SeedableRng;

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
        for text in node.texts(&mut r, 10) {
            let whole = reference.is_match(&text);
            assert_eq!(matches(&raw, &text), whole, "{pattern:?} on {text:?}");
            let escaped = serde_json::to_string(&text).unwrap();
            let escaped = &escaped[1..escaped.len() - 1];
            assert_eq!(matches(&in_json, escaped), whole, "{pattern:?} in JSON on {escaped:?}");
            checked += 1;
            matched += whole as usize;
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

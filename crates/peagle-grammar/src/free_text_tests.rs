//! Free text's tests: excluded and dispatched patterns against brute force and by hand,
//! special tokens in patterns and anywhere, and the limits on a text's automaton.

use super::*;
use crate::grammar::Grammar;

/// Free text excluding `excludes`, where each dispatch pattern is followed by its text.
fn grammar(excludes: &[&str], dispatch: &[(&str, &str)], again: bool) -> Grammar {
    let mut b = GrammarBuilder::new();
    let excludes: Vec<Literal> = excludes.iter().map(|e| Literal::text(e)).collect();
    let dispatch: Vec<(Literal, Seq)> = dispatch
        .iter()
        .map(|(p, then)| (Literal::text(p), GrammarBuilder::literal(then.as_bytes())))
        .collect();
    let text = FreeText {
        excludes: &excludes,
        dispatch: &dispatch,
        again,
        any_token: false,
    };
    let text = free_text(&mut b, &text).unwrap();
    b.finish(vec![text]).unwrap()
}

fn accepts(g: &Grammar, text: &str) -> bool {
    g.advance_bytes(&g.start(), text.as_bytes()).accepts()
}

/// Whether `text` is free text as `grammar` means it, by brute force: each segment of
/// free text (from the start, or from the end of a dispatched pattern's format) is read
/// character by character; one that comes to end with an excluded pattern fails, and one
/// that comes to end with dispatched patterns must go on with one of their formats.
fn reference(text: &[char], from: usize, excludes: &[&str], dispatch: &[(&str, &str)], again: bool) -> bool {
    let ends_with = |segment: &[char], pattern: &str| {
        let p: Vec<char> = pattern.chars().collect();
        segment.ends_with(&p)
    };
    for end in from..text.len() {
        let segment = &text[from..=end];
        if excludes.iter().any(|e| ends_with(segment, e)) {
            return false;
        }
        let done: Vec<&str> = dispatch
            .iter()
            .filter(|(p, _)| ends_with(segment, p))
            .map(|(_, format)| *format)
            .collect();
        if !done.is_empty() {
            return done.iter().any(|format| {
                let format: Vec<char> = format.chars().collect();
                let after = end + 1 + format.len();
                text[end + 1..].starts_with(&format)
                    && match again {
                        true => reference(text, after, excludes, dispatch, again),
                        false => after == text.len(),
                    }
            });
        }
    }
    true
}

/// Random excludes and dispatched patterns over three letters, so that they overlap and
/// nest: every text of up to six letters is free text exactly when `reference` says so.
#[test]
fn random_patterns_watch_text_as_brute_force_does() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut r = StdRng::seed_from_u64(20261203);
    let word = |r: &mut StdRng, lengths: std::ops::RangeInclusive<usize>| -> String {
        (0..r.random_range(lengths))
            .map(|_| ['a', 'b', 'c'][r.random_range(0..3)])
            .collect()
    };
    let mut texts: Vec<Vec<char>> = vec![Vec::new()];
    let mut next = 0;
    while next < texts.len() {
        if texts[next].len() < 6 {
            let longer: Vec<Vec<char>> = ['a', 'b', 'c'].map(|c| [&texts[next][..], &[c]].concat()).to_vec();
            texts.extend(longer);
        }
        next += 1;
    }
    let mut accepted = 0;
    for _ in 0..60 {
        let excludes: Vec<String> = (0..r.random_range(0..=2)).map(|_| word(&mut r, 1..=3)).collect();
        let dispatch: Vec<(String, String)> = (0..r.random_range(0..=2))
            .map(|_| (word(&mut r, 1..=3), word(&mut r, 0..=2)))
            .collect();
        let again = r.random_bool(0.5);
        let excludes: Vec<&str> = excludes.iter().map(String::as_str).collect();
        let dispatch: Vec<(&str, &str)> = dispatch.iter().map(|(p, f)| (p.as_str(), f.as_str())).collect();
        let g = grammar(&excludes, &dispatch, again);
        for text in &texts {
            let s: String = text.iter().collect();
            let want = reference(text, 0, &excludes, &dispatch, again);
            assert_eq!(
                accepts(&g, &s),
                want,
                "{s:?} with excludes {excludes:?}, dispatch {dispatch:?}, again {again}"
            );
            accepted += want as usize;
        }
    }
    assert!(accepted > 10_000, "{accepted} texts accepted");
}

/// Overlapping excludes: "aab" holds "ab", though the text's first "a" began "aa...".
#[test]
fn excluded_strings_never_appear() {
    let g = grammar(&["ab", "bca"], &[], true);
    for ok in ["", "a", "aa", "ba", "bc", "bcb", "xyz é", "ba\u{E000}"] {
        assert!(accepts(&g, ok), "{ok:?}");
    }
    for banned in ["ab", "aab", "xab", "bca", "bbca", "zbcaz"] {
        assert!(!accepts(&g, banned), "{banned:?}");
    }
}

/// A trigger's completion must be followed by its format; free text resumes after it
/// with `again`, else the text ends there.
#[test]
fn a_dispatched_pattern_is_followed_by_its_format() {
    let g = grammar(&[], &[("<f=", "x>")], true);
    assert!(accepts(&g, "hi <f=x> and <f=x>"));
    assert!(accepts(&g, "<<f=x><"), "a partial trigger may end the text");
    assert!(!accepts(&g, "hi <f=y>"), "the trigger holds its format");
    assert!(!accepts(&g, "<f="), "a trigger's format is whole");
    let once = grammar(&[], &[("<f=", "x>")], false);
    assert!(accepts(&once, "hi <f=x>"));
    assert!(!accepts(&once, "hi <f=x> more"), "nothing follows the first");
}

/// Text around special tokens: a pattern may name one, which free text holds only as
/// that pattern's start, or with `any_token` as any other token too, but for an excluded
/// one.
#[test]
fn special_tokens_appear_in_patterns_or_anywhere() {
    let token = |id: u32| Symbol::Token(id).bytes();
    let text_with = |parts: &[&[u8]]| parts.concat();
    for any_token in [false, true] {
        let mut b = GrammarBuilder::new();
        let dispatch = [(
            Literal(vec![Symbol::Token(7), Symbol::Char('c')]),
            GrammarBuilder::literal(b"!"),
        )];
        let text = FreeText {
            excludes: &[Literal::token(0x0101)],
            dispatch: &dispatch,
            again: true,
            any_token,
        };
        let text = free_text(&mut b, &text).unwrap();
        let g = b.finish(vec![text]).unwrap();
        let run = |bytes: &[u8]| g.advance_bytes(&g.start(), bytes).accepts();
        assert!(run(&text_with(&[b"a", &token(7), b"c!", b"b"])));
        assert!(run(&text_with(&[&token(7), b"x"])), "the token, then other text");
        assert!(!run(&text_with(&[&token(7), b"c?"])), "the pattern holds its format");
        for other in [0, 8, 0x0100, 0x0102, 0xFF_FFFF] {
            assert_eq!(
                run(&text_with(&[b"a", &token(other), b"b"])),
                any_token,
                "token {other}"
            );
        }
        assert!(!run(&text_with(&[b"a", &token(0x0101)])), "an excluded token");
    }
}

/// The ranges between two byte strings cover exactly the numbers between them.
#[test]
fn byte_ranges_cover_the_numbers_between_their_ends() {
    let number = |b: &[u8]| b.iter().fold(0u32, |n, &x| n << 8 | x as u32);
    for (lo, hi) in [
        (0u32, 0xFF_FFFFu32),
        (5, 0x0100),
        (0x01FF, 0x0201),
        (0x00_0100, 0x01_0000),
        (7, 7),
        (0x12_34FF, 0x13_0000),
    ] {
        let (l, h) = (&lo.to_be_bytes()[1..], &hi.to_be_bytes()[1..]);
        let ranges = byte_ranges(l, h);
        let covers = |n: u32| {
            let bytes = &n.to_be_bytes()[1..];
            ranges
                .iter()
                .filter(|r| r.iter().zip(bytes).all(|(&(a, z), &x)| a <= x && x <= z))
                .count()
        };
        assert_eq!(number(l), lo);
        for n in [
            lo.saturating_sub(1),
            lo,
            lo + 1,
            (lo + hi) / 2,
            hi.max(1) - 1,
            hi,
            hi + 1,
        ]
        .into_iter()
        .filter(|&n| n <= 0xFF_FFFF)
        {
            let inside = (lo..=hi).contains(&n);
            assert_eq!(covers(n), inside as usize, "{n:#x} in {lo:#x}..={hi:#x}: {ranges:?}");
        }
    }
}

/// Thousands of patterns that begin alike would make a step from every state to each
/// pattern's start: refused once the steps outnumber a grammar's elements.
#[test]
fn too_many_steps_are_refused() {
    let mut b = GrammarBuilder::new();
    let patterns: Vec<Literal> = (0..2000u32)
        .map(|i| Literal::text(&format!("{}{}", char::from_u32(0x4E00 + i).unwrap(), "x".repeat(100))))
        .collect();
    let text = FreeText {
        excludes: &patterns,
        dispatch: &[],
        again: true,
        any_token: false,
    };
    assert_eq!(
        free_text(&mut b, &text).unwrap_err(),
        GrammarError::TooLarge(MAX_ELEMENTS)
    );
}

#[test]
fn empty_patterns_are_refused() {
    let mut b = GrammarBuilder::new();
    let text = FreeText {
        excludes: &[Literal::default()],
        dispatch: &[],
        again: true,
        any_token: false,
    };
    assert!(matches!(free_text(&mut b, &text), Err(GrammarError::Structure(_))));
}

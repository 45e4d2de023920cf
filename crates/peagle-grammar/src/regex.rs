//! Regular expressions (Rust's `regex` syntax, as regex-syntax parses it) to grammar
//! elements: the text of a `guided_regex`, or the characters inside a JSON string where a
//! schema's `pattern` constrains it (there a `"`, a backslash or a control character the
//! pattern allows is written as its JSON escape). A pattern matches the text whole; `^` and `$`
//! are allowed only at its ends.

use crate::error::GrammarError;
use crate::grammar::{ByteSet, Element, GrammarBuilder, Seq};
use regex_syntax::hir::{Class, Hir, HirKind, Look};

/// How a character the pattern matches is written.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Chars {
    /// As its UTF-8 bytes.
    Raw,
    /// As a JSON string writes it, escaped where JSON requires.
    InJsonString,
}

/// The elements matching the whole of `pattern`.
pub fn compile(b: &mut GrammarBuilder, pattern: &str, chars: Chars) -> Result<Seq, GrammarError> {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .map_err(|e| GrammarError::Regex(one_line(&e)))?;
    let inner = without_end_anchors(&hir);
    let mut out = Vec::new();
    for hir in inner {
        out.extend(Compiler { b, chars }.hir(hir)?);
    }
    Ok(out)
}

/// A parse error in one line: what is wrong and where (regex-syntax draws the pattern over
/// several lines).
fn one_line(e: &regex_syntax::Error) -> String {
    match e {
        regex_syntax::Error::Parse(e) => format!("{} at offset {}", e.kind(), e.span().start.offset),
        regex_syntax::Error::Translate(e) => format!("{} at offset {}", e.kind(), e.span().start.offset),
        other => other.to_string().lines().last().unwrap_or_default().to_string(),
    }
}

/// The pattern's parts, less the anchors at its start and end.
fn without_end_anchors(hir: &Hir) -> Vec<&Hir> {
    let parts: Vec<&Hir> = match hir.kind() {
        HirKind::Concat(parts) => parts.iter().collect(),
        _ => vec![hir],
    };
    let is = |h: &&Hir, looks: &[Look]| matches!(h.kind(), HirKind::Look(l) if looks.contains(l));
    let start = [Look::Start, Look::StartLF, Look::StartCRLF];
    let end = [Look::End, Look::EndLF, Look::EndCRLF];
    let first = parts.iter().position(|h| !is(h, &start)).unwrap_or(parts.len());
    let last = parts.iter().rposition(|h| !is(h, &end)).map_or(first, |i| i + 1);
    parts[first..last.max(first)].to_vec()
}

struct Compiler<'a> {
    b: &'a mut GrammarBuilder,
    chars: Chars,
}

impl Compiler<'_> {
    fn hir(&mut self, hir: &Hir) -> Result<Seq, GrammarError> {
        match hir.kind() {
            HirKind::Empty => Ok(Vec::new()),
            HirKind::Literal(lit) => {
                let text =
                    std::str::from_utf8(&lit.0).map_err(|_| GrammarError::RegexFeature("a byte literal".into()))?;
                let mut out = Vec::new();
                for c in text.chars() {
                    out.extend(self.char_ranges(&[(c, c)])?);
                }
                Ok(out)
            }
            HirKind::Class(Class::Unicode(class)) => {
                let ranges: Vec<(char, char)> = class.iter().map(|r| (r.start(), r.end())).collect();
                self.char_ranges(&ranges)
            }
            // regex-syntax writes a class that matches nothing as an empty byte class.
            HirKind::Class(Class::Bytes(class)) if class.ranges().is_empty() => Ok(vec![self.b.rule(Vec::new())?]),
            HirKind::Class(Class::Bytes(_)) => Err(GrammarError::RegexFeature("a byte class".into())),
            HirKind::Look(look) => Err(GrammarError::RegexFeature(format!(
                "the assertion {look:?} inside a pattern"
            ))),
            HirKind::Repetition(rep) => {
                let sub = self.hir(&rep.sub)?;
                self.b.repeat(sub, rep.min, rep.max)
            }
            HirKind::Capture(cap) => self.hir(&cap.sub),
            HirKind::Concat(parts) => {
                let mut out = Vec::new();
                for part in parts {
                    out.extend(self.hir(part)?);
                }
                Ok(out)
            }
            HirKind::Alternation(alts) => {
                let alts = alts.iter().map(|a| self.hir(a)).collect::<Result<Vec<_>, _>>()?;
                Ok(vec![self.b.rule(alts)?])
            }
        }
    }

    /// One character in `ranges`, written as `self.chars` says.
    fn char_ranges(&mut self, ranges: &[(char, char)]) -> Result<Seq, GrammarError> {
        match self.chars {
            Chars::Raw => Ok(vec![self.b.chars(ranges)?]),
            Chars::InJsonString => json_chars(self.b, ranges),
        }
    }
}

/// One character in `ranges` as it stands inside a JSON string: raw, but for `"`, the
/// backslash and control characters, which are escaped (`\n` and its kin where JSON has a
/// short escape, `\u00XX` for the rest).
pub fn json_chars(b: &mut GrammarBuilder, ranges: &[(char, char)]) -> Result<Seq, GrammarError> {
    let mut raw = Vec::new();
    let mut escaped: Vec<Seq> = Vec::new();
    for &(lo, hi) in ranges {
        let mut from = lo as u32;
        for special in (0..0x20).chain([0x22, 0x5c]) {
            if special < from || special > hi as u32 {
                continue;
            }
            if special > from {
                raw.push((char::from_u32(from).unwrap(), char::from_u32(special - 1).unwrap()));
            }
            escaped.push(escape(special as u8));
            from = special + 1;
        }
        if from <= hi as u32 {
            raw.push((char::from_u32(from).unwrap(), hi));
        }
    }
    if !raw.is_empty() {
        escaped.push(vec![b.chars(&raw)?]);
    }
    match escaped.len() {
        1 => Ok(escaped.pop().unwrap()),
        _ => Ok(vec![b.rule(escaped)?]),
    }
}

/// JSON's escape of a `"`, a backslash or a control character.
fn escape(c: u8) -> Seq {
    let short = match c {
        b'"' => Some(b'"'),
        b'\\' => Some(b'\\'),
        b'\n' => Some(b'n'),
        b'\t' => Some(b't'),
        b'\r' => Some(b'r'),
        0x08 => Some(b'b'),
        0x0c => Some(b'f'),
        _ => None,
    };
    match short {
        Some(s) => GrammarBuilder::literal(&[b'\\', s]),
        None => {
            let hex = |d: u8| {
                let digit = b"0123456789abcdef"[d as usize];
                Element::Bytes(ByteSet::byte(digit).union(ByteSet::byte(digit.to_ascii_uppercase())))
            };
            let mut seq = GrammarBuilder::literal(b"\\u00");
            seq.extend([hex(c >> 4), hex(c & 15)]);
            seq
        }
    }
}

#[cfg(test)]
#[path = "regex_tests.rs"]
mod tests;

//! Grammars written in GBNF, the EBNF dialect of llama.cpp that xgrammar also reads (vLLM's
//! `guided_grammar`): rules `name ::= body`, the text being what `root` matches. A body has
//! string literals ("..."), character classes ([a-z], [^"\\]), `.` for any character,
//! references to rules, groups, alternatives (|), and repetition (*, +, ?, {m}, {m,}, {m,n});
//! `#` starts a comment. Literals and classes take the escapes \n \r \t \\ \" \] \- \xHH
//! \uHHHH and \UHHHHHHHH.
//!
//! A rule that reaches itself again before reading a byte, other than by repeating at its
//! end, is refused: left recursion would grow the parse's stacks without end.

use crate::error::GrammarError;
use crate::grammar::{complement, Element, Grammar, GrammarBuilder, RuleId, Seq};
use std::collections::HashMap;

/// The grammar `text` writes.
pub fn ebnf_grammar(text: &str) -> Result<Grammar, GrammarError> {
    let mut parser = Parser {
        chars: text.chars().collect(),
        at: 0,
        b: GrammarBuilder::new(),
        rules: HashMap::new(),
        defined: Vec::new(),
    };
    parser.rules()?;
    let root = *parser
        .rules
        .get("root")
        .filter(|_| parser.defined.iter().any(|d| d == "root"))
        .ok_or_else(|| invalid(0, "no rule is named root"))?;
    if let Some(name) = parser.rules.keys().find(|n| !parser.defined.contains(n)) {
        return Err(GrammarError::Ebnf(format!("rule {name} is used but never defined")));
    }
    let grammar = parser.b.build(root);
    if let Some(rule) = left_recursive(&grammar) {
        let name = parser
            .rules
            .iter()
            .find(|(_, &id)| id == rule)
            .map_or("a repetition".to_string(), |(n, _)| n.clone());
        return Err(GrammarError::Ebnf(format!("rule {name} is left-recursive")));
    }
    Ok(grammar)
}

fn invalid(at: usize, why: impl std::fmt::Display) -> GrammarError {
    GrammarError::Ebnf(format!("{why} (at character {at})"))
}

struct Parser {
    chars: Vec<char>,
    at: usize,
    b: GrammarBuilder,
    /// Every rule named so far, defined or only referred to.
    rules: HashMap<String, RuleId>,
    defined: Vec<String>,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    /// Skips whitespace, newlines and comments.
    fn skip(&mut self) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.at += 1;
                }
            } else if c.is_whitespace() {
                self.at += 1;
            } else {
                break;
            }
        }
    }

    fn rules(&mut self) -> Result<(), GrammarError> {
        self.skip();
        while self.peek().is_some() {
            let name = self.name().ok_or_else(|| invalid(self.at, "a rule name is expected"))?;
            self.skip();
            if !self.eat("::=") {
                return Err(invalid(self.at, format!("::= is expected after {name}")));
            }
            if self.defined.contains(&name) {
                return Err(invalid(self.at, format!("rule {name} is defined twice")));
            }
            let id = self.rule_id(&name);
            let alternatives = self.alternatives()?;
            self.b.define(id, alternatives)?;
            self.defined.push(name);
            self.skip();
        }
        Ok(())
    }

    fn eat(&mut self, text: &str) -> bool {
        let n = text.chars().count();
        let matches = self
            .chars
            .get(self.at..self.at + n)
            .is_some_and(|s| s.iter().copied().eq(text.chars()));
        if matches {
            self.at += n;
        }
        matches
    }

    fn name(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(name_char) {
            self.at += 1;
        }
        (self.at > start).then(|| self.chars[start..self.at].iter().collect())
    }

    fn rule_id(&mut self, name: &str) -> RuleId {
        if let Some(&id) = self.rules.get(name) {
            return id;
        }
        let id = self.b.reserve();
        self.rules.insert(name.to_string(), id);
        id
    }

    /// Whether a rule definition (`name ::=`) starts here, ending the body before it.
    fn at_definition(&self) -> bool {
        let mut at = self.at;
        while self.chars.get(at).copied().is_some_and(name_char) {
            at += 1;
        }
        while self.chars.get(at).is_some_and(|c| c.is_whitespace()) {
            at += 1;
        }
        at > self.at && self.chars.get(at..at + 3).is_some_and(|s| s == [':', ':', '='])
    }

    /// Alternatives separated by `|`, up to the body's end (the next definition, a closing
    /// parenthesis, or the end of the text).
    fn alternatives(&mut self) -> Result<Vec<Seq>, GrammarError> {
        let mut alternatives = vec![self.sequence()?];
        while self.peek() == Some('|') {
            self.at += 1;
            alternatives.push(self.sequence()?);
        }
        Ok(alternatives)
    }

    fn sequence(&mut self) -> Result<Seq, GrammarError> {
        let mut seq = Vec::new();
        loop {
            self.skip();
            match self.peek() {
                None | Some('|') | Some(')') => return Ok(seq),
                _ if self.at_definition() => return Ok(seq),
                _ => {
                    let item = self.item()?;
                    let item = self.repetition(item)?;
                    seq.extend(item);
                }
            }
        }
    }

    fn item(&mut self) -> Result<Seq, GrammarError> {
        let at = self.at;
        match self.peek() {
            Some('"') => {
                self.at += 1;
                let mut text = String::new();
                loop {
                    match self.peek() {
                        None => return Err(invalid(at, "a string is not closed")),
                        Some('"') => break,
                        Some('\\') => text.push(self.escape()?),
                        Some(c) => {
                            text.push(c);
                            self.at += 1;
                        }
                    }
                }
                self.at += 1;
                Ok(GrammarBuilder::literal(text.as_bytes()))
            }
            Some('[') => {
                self.at += 1;
                let ranges = self.class(at)?;
                Ok(vec![self.b.chars(&ranges)?])
            }
            Some('.') => {
                self.at += 1;
                Ok(vec![self.b.chars(&[('\0', char::MAX)])?])
            }
            Some('(') => {
                self.at += 1;
                let alternatives = self.alternatives()?;
                if self.peek() != Some(')') {
                    return Err(invalid(at, "a group is not closed"));
                }
                self.at += 1;
                Ok(vec![self.b.rule(alternatives)?])
            }
            _ => match self.name() {
                Some(name) => Ok(vec![Element::Rule(self.rule_id(&name))]),
                None => Err(invalid(at, format!("unexpected {:?}", self.peek().unwrap_or(' ')))),
            },
        }
    }

    /// The ranges of a class after its `[`, complemented after a `^`.
    fn class(&mut self, at: usize) -> Result<Vec<(char, char)>, GrammarError> {
        let negated = self.peek() == Some('^');
        if negated {
            self.at += 1;
        }
        let mut ranges = Vec::new();
        loop {
            let lo = match self.peek() {
                None => return Err(invalid(at, "a class is not closed")),
                Some(']') => break,
                Some('\\') => self.escape()?,
                Some(c) => {
                    self.at += 1;
                    c
                }
            };
            let hi = if self.peek() == Some('-') && self.chars.get(self.at + 1).is_some_and(|&c| c != ']') {
                self.at += 1;
                match self.peek() {
                    Some('\\') => self.escape()?,
                    Some(c) => {
                        self.at += 1;
                        c
                    }
                    None => return Err(invalid(at, "a class is not closed")),
                }
            } else {
                lo
            };
            if hi < lo {
                return Err(invalid(at, format!("the range {lo:?}-{hi:?} runs backwards")));
            }
            ranges.push((lo, hi));
        }
        self.at += 1;
        Ok(if negated { complement(ranges) } else { ranges })
    }

    /// The character an escape (at its backslash) stands for.
    fn escape(&mut self) -> Result<char, GrammarError> {
        let at = self.at;
        self.at += 1;
        let c = self.peek().ok_or_else(|| invalid(at, "an escape is cut off"))?;
        self.at += 1;
        let hex = |parser: &mut Self, digits: usize| {
            let text: String = parser
                .chars
                .get(parser.at..parser.at + digits)
                .unwrap_or_default()
                .iter()
                .collect();
            parser.at += digits;
            u32::from_str_radix(&text, 16)
                .ok()
                .filter(|_| text.len() == digits)
                .and_then(char::from_u32)
                .ok_or_else(|| invalid(at, format!("\\{c}{text} is no character")))
        };
        match c {
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            't' => Ok('\t'),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            '\\' | '"' | ']' | '[' | '-' | '^' | '/' => Ok(c),
            other => Err(invalid(at, format!("unknown escape \\{other}"))),
        }
    }

    /// `item` repeated as the postfix operator after it says, if one follows.
    fn repetition(&mut self, item: Seq) -> Result<Seq, GrammarError> {
        let at = self.at;
        match self.peek() {
            Some('*') => {
                self.at += 1;
                Ok(vec![self.b.star(item)?])
            }
            Some('+') => {
                self.at += 1;
                self.b.repeat(item, 1, None)
            }
            Some('?') => {
                self.at += 1;
                Ok(vec![self.b.optional(item)?])
            }
            Some('{') => {
                self.at += 1;
                let number = |p: &mut Self| {
                    let start = p.at;
                    while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                        p.at += 1;
                    }
                    p.chars[start..p.at].iter().collect::<String>().parse::<u32>().ok()
                };
                let min = number(self).ok_or_else(|| invalid(at, "a count is expected after {"))?;
                let max = match self.peek() {
                    Some(',') => {
                        self.at += 1;
                        number(self)
                    }
                    _ => Some(min),
                };
                if self.peek() != Some('}') || max.is_some_and(|max| max < min) {
                    return Err(invalid(at, "a repetition is {m}, {m,} or {m,n} with m <= n"));
                }
                self.at += 1;
                self.b.repeat(item, min, max)
            }
            _ => Ok(item),
        }
    }
}

/// Whether `c` may be part of a rule's name.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.'
}

/// A rule that reaches itself before reading a byte through a reference with more after it
/// (which grows the parse's stacks), if any. A rule is nullable when some alternative is all
/// nullable; rule A reaches B when B is referred to in A before any element that must read a
/// byte.
fn left_recursive(g: &Grammar) -> Option<RuleId> {
    let n = g.rules.len();
    let mut nullable = vec![false; n];
    let element_nullable = |e: &Element, nullable: &[bool]| match e {
        Element::Bytes(_) => false,
        Element::Rule(r) => nullable[*r as usize],
    };
    loop {
        let mut changed = false;
        for (r, alternatives) in g.rules.iter().enumerate() {
            if !nullable[r]
                && alternatives
                    .iter()
                    .any(|a| a.iter().all(|e| element_nullable(e, &nullable)))
            {
                nullable[r] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Edges A -> B with whether B has more after it in that alternative.
    let mut edges: Vec<Vec<(RuleId, bool)>> = vec![Vec::new(); n];
    for (r, alternatives) in g.rules.iter().enumerate() {
        for alternative in alternatives {
            for (i, e) in alternative.iter().enumerate() {
                if let Element::Rule(target) = e {
                    edges[r].push((*target, i + 1 < alternative.len()));
                }
                if !element_nullable(e, &nullable) {
                    break;
                }
            }
        }
    }
    let reaches = |from: RuleId, to: RuleId| {
        let mut seen = vec![false; n];
        let mut todo = vec![from];
        while let Some(r) = todo.pop() {
            if r == to {
                return true;
            }
            if !std::mem::replace(&mut seen[r as usize], true) {
                todo.extend(edges[r as usize].iter().map(|e| e.0));
            }
        }
        false
    };
    (0..n as RuleId).find(|&a| edges[a as usize].iter().any(|&(b, more)| more && reaches(b, a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(g: &Grammar, text: &str) -> bool {
        g.advance_bytes(&g.start(), text.as_bytes()).accepts()
    }

    /// A JSON-ish grammar in GBNF, as llama.cpp's examples write them.
    #[test]
    fn a_gbnf_grammar_matches_its_language() {
        let g = ebnf_grammar(
            r#"
            # A list of calls.
            root   ::= "[" ws call ("," ws call)* "]"
            call   ::= name "(" args? ")" ws
            name   ::= [a-z_] [a-z0-9_]{0,15}
            args   ::= arg ("," ws arg)*
            arg    ::= num | str
            num    ::= "-"? [0-9]+ ("." [0-9]+)?
            str    ::= "\"" ([^"\\\x00-\x1f] | "\\" ["\\nt])* "\""
            ws     ::= [ \t\n]*
            "#,
        )
        .unwrap();
        for text in ["[f()]", "[ f(1, \"a\\\"b\"),\n  g_2(-3.5)]", "[x(\"日本\")]"] {
            assert!(whole(&g, text), "{text:?}");
        }
        for text in ["[]", "[F()]", "[f(1,)]", "[f(\"a\nb\")]", "[f()] "] {
            assert!(!whole(&g, text), "{text:?}");
        }
    }

    /// Random patterns written in GBNF (their capture groups as rules of their own), against
    /// the regex crate on the same patterns: texts drawn to match and their one-character
    /// mutations are taken exactly when the regex matches them whole.
    #[test]
    fn random_grammars_match_what_the_same_regexes_match() {
        use crate::random_patterns::Node;
        use rand::rngs::StdRng;
        use rand::SeedableRng;
        let mut r = StdRng::seed_from_u64(20261203);
        let (mut grammars, mut matched) = (0, 0);
        while grammars < 200 {
            let node = Node::draw(&mut r, 3);
            let mut rules = Vec::new();
            let Some(root) = node.gbnf(&mut rules) else { continue };
            rules.push(format!("root ::= {root}"));
            let text = rules.join("\n");
            let g = ebnf_grammar(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            let reference = ::regex::Regex::new(&format!("^(?:{})$", node.pattern())).unwrap();
            for t in node.texts(&mut r, 10) {
                let want = reference.is_match(&t);
                assert_eq!(whole(&g, &t), want, "{text} on {t:?}");
                matched += want as usize;
            }
            grammars += 1;
        }
        assert!(matched > 1000, "{matched} texts matched");
    }

    #[test]
    fn escapes_classes_and_counts() {
        let g = ebnf_grammar(r#"root ::= [^a-c\]] "\u00e9\x41" .{2} "z"{1,2}"#).unwrap();
        assert!(!whole(&g, "]éA日xz") && whole(&g, "déA日xz") && whole(&g, "déAxyzz"));
        assert!(!whole(&g, "béAxyz") && !whole(&g, "déAxyzzz"));
    }

    #[test]
    fn what_cannot_be_a_grammar_is_refused() {
        for (text, says) in [
            ("expr ::= \"a\"", "no rule is named root"),
            ("root ::= item", "never defined"),
            ("root ::= \"a\"\nroot ::= \"b\"", "defined twice"),
            ("root ::= \"a", "not closed"),
            ("root ::= [a-", "not closed"),
            ("root ::= (\"a\"", "not closed"),
            ("root ::= [z-a]", "backwards"),
            ("root ::= \"a\"{3,2}", "repetition"),
            ("root ::= \"\\q\"", "unknown escape"),
            ("root ::= root \"a\" | \"b\"", "left-recursive"),
            ("root ::= x \"a\"\nx ::= root? \"b\"", "left-recursive"),
            ("root ::= @", "unexpected"),
        ] {
            let e = ebnf_grammar(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        // Repeating at a rule's end is right recursion, which the parser follows.
        let g = ebnf_grammar("root ::= \"a\" root | \"b\"").unwrap();
        assert!(whole(&g, "aaab") && !whole(&g, "aa"));
    }
}

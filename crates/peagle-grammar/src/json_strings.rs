//! JSON strings' grammars from their schemas (`minLength`, `maxLength`, `pattern`, `format`):
//! the strings of `json_schema`'s compiler, their characters as JSON writes them.

use super::{count, err, JsonCompiler};
use crate::error::GrammarError;
use crate::grammar::{Element, GrammarBuilder};
use crate::regex::{self, Chars};
use serde_json::{Map, Value};

impl JsonCompiler<'_> {
    pub(super) fn string(&mut self, object: &Map<String, Value>, path: &str) -> Result<Element, GrammarError> {
        let (min, max) = (count(object, "minLength", path)?, count(object, "maxLength", path)?);
        // A format beside lengths is an annotation, as JSON Schema lets it be: the lengths
        // are enforced (`{"format": "email", "maxLength": 254}`).
        let lengths = min.is_some() || max.is_some();
        let pattern = match (object.get("pattern"), object.get("format").and_then(Value::as_str)) {
            (Some(p), _) => Some(p.as_str().ok_or_else(|| err(path, "pattern must be a string"))?),
            (None, Some(format)) if !lengths => format_pattern(format),
            _ => None,
        };
        let content = match pattern {
            Some(pattern) if lengths => {
                return Err(GrammarError::SchemaKeyword {
                    path: path.to_string(),
                    keyword: format!("minLength or maxLength beside the pattern {pattern:?}"),
                })
            }
            Some(pattern) => regex::compile(self.b, pattern, Chars::InJsonString)?,
            None if min.is_none() && max.is_none() => return self.primitive("string"),
            None => {
                if max.is_some_and(|max| max < min.unwrap_or(0)) {
                    return Err(err(path, "maxLength is less than minLength"));
                }
                let char = self.string_char()?;
                self.b.repeat(vec![char], min.unwrap_or(0), max)?
            }
        };
        let mut seq = GrammarBuilder::literal(b"\"");
        seq.extend(content);
        seq.extend(GrammarBuilder::literal(b"\""));
        self.b.unit(seq)
    }

    /// One character of a JSON string: raw, or any of JSON's escapes, a `\u` escape of a
    /// UTF-16 surrogate only as half of a pair (a lone one is no character, and JSON parsers
    /// refuse it).
    pub(super) fn string_char(&mut self) -> Result<Element, GrammarError> {
        if let Some(&e) = self.primitives.get("char") {
            return Ok(e);
        }
        const CHAR: &str = concat!(
            r#"[^"\\\x00-\x1F]|\\["\\/bfnrt]"#,
            r"|\\u([0-9A-Ca-c][0-9A-Fa-f]{3}|[Dd][0-7][0-9A-Fa-f]{2}|[E-Fe-f][0-9A-Fa-f]{3})",
            r"|\\u[Dd][89ABab][0-9A-Fa-f]{2}\\u[Dd][C-Fc-f][0-9A-Fa-f]{2}",
        );
        let seq = regex::compile(self.b, CHAR, Chars::Raw)?;
        let e = self.b.unit(seq)?;
        self.primitives.insert("char", e);
        Ok(e)
    }
}

/// The pattern of a string `format` the grammar enforces; None for the formats it treats as
/// annotations. Each takes only valid text of its format (RFC 3339's dates and times, RFC
/// 5321's addresses), a subset where the whole would not fit a bounded pattern: a date's day
/// exists in its month (29 February in leap years only), a time has no leap second, and an
/// address has at most two dots in its local part's 64 characters and one to three labels (1
/// to 63 letters, digits or inner hyphens) before its top-level domain: under 254 in all.
fn format_pattern(format: &str) -> Option<&'static str> {
    macro_rules! date {
        () => {
            concat!(
                r"([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)",
                r"|02-(0[1-9]|1[0-9]|2[0-8]))",
                r"|([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29)"
            )
        };
    }
    macro_rules! time {
        () => {
            r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
        };
    }
    macro_rules! atom {
        ($n:literal) => {
            concat!("[a-zA-Z0-9_%+-]{1,", $n, "}")
        };
    }
    macro_rules! label {
        () => {
            r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\."
        };
    }
    match format {
        "date" => Some(date!()),
        "time" => Some(time!()),
        "date-time" => Some(concat!(date!(), "T", time!())),
        "uuid" => Some(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
        "email" => Some(concat!(
            "(",
            atom!(64),
            "|",
            atom!(31),
            r"\.",
            atom!(32),
            "|",
            atom!(20),
            r"\.",
            atom!(20),
            r"\.",
            atom!(21),
            ")@(",
            label!(),
            "){1,3}[a-zA-Z]{2,24}"
        )),
        "ipv4" => {
            Some(r"((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])")
        }
        _ => None,
    }
}

//! xgrammar's structural tags, as vLLM takes them (`response_format` of type
//! `structural_tag`, `structured_outputs.structural_tag`), read into a `Format`.
//!
//! Two shapes: `{"format": FORMAT}`, a tree of format objects, and the older
//! `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`, which is free text where
//! a trigger starts one of the structures. The formats read are the string-level ones:
//! `const_string`, `json_schema` (style `json`), `grammar`, `regex`, `any_text` (with
//! `excludes`), `sequence`, `or`, `optional`, `plus`, `star`, `repeat`, `tag`,
//! `triggered_tags`, `tags_with_separator` and `dispatch`, and `token`, a special token by
//! id or name, which a tag may also begin or end with; and the token-level free formats
//! `any_tokens`, `token_triggered_tags` and `token_dispatch`, which watch for special tokens
//! (a text token among their `trigger_tokens` or `exclude_tokens` is refused: text cannot
//! be told apart by its tokens here). A string that holds a special token's
//! name (`<|channel|>`) means that token there, as a model writes it, and free text may hold
//! any special token, as xgrammar's text holds a special token's name (harmony's markers
//! between the messages that triggers start; a stop token ends the answer where it comes).
//! `exclude_token` (one token of any text) and the free formats' length limits are refused, as
//! is `any_order`.

use crate::error::GrammarError;
use crate::structure::{Format, Literal, Tag};
use crate::vocabulary::Vocabulary;
use serde_json::{Map, Value};
use std::fmt::Display;

/// The deepest formats may nest.
const MAX_DEPTH: usize = 64;

/// The structure `tag` describes, for a model of `vocab`.
pub fn structural_tag(tag: &Value, vocab: &Vocabulary) -> Result<Format, GrammarError> {
    let names = vocab.special_names().iter().map(|(n, id)| (n.as_str(), *id)).collect();
    let reader = Reader { vocab, names };
    let tag = object(tag, "structural_tag")?;
    if let Some(format) = field(tag, "format") {
        return reader.format(format, "format", 0);
    }
    match field(tag, "structures") {
        Some(structures) => reader.structures(structures, field(tag, "triggers")),
        None => Err(invalid(
            "structural_tag",
            "give its format (or structures and triggers)",
        )),
    }
}

fn invalid(path: &str, why: impl Display) -> GrammarError {
    GrammarError::Structure(format!("{path}: {why}"))
}

/// `key` of `object`, where it is not null.
fn field<'v>(object: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    object.get(key).filter(|v| !v.is_null())
}

fn object<'v>(value: &'v Value, path: &str) -> Result<&'v Map<String, Value>, GrammarError> {
    value.as_object().ok_or_else(|| invalid(path, "must be an object"))
}

fn required<'v>(object: &'v Map<String, Value>, key: &str, path: &str) -> Result<&'v Value, GrammarError> {
    field(object, key).ok_or_else(|| invalid(path, format!("{key} is required")))
}

fn string<'v>(value: &'v Value, path: &str) -> Result<&'v str, GrammarError> {
    value.as_str().ok_or_else(|| invalid(path, "must be a string"))
}

fn array<'v>(value: &'v Value, path: &str) -> Result<&'v [Value], GrammarError> {
    value
        .as_array()
        .filter(|a| !a.is_empty())
        .map(Vec::as_slice)
        .ok_or_else(|| invalid(path, "must be a non-empty array"))
}

fn flag(object: &Map<String, Value>, key: &str, default: bool, path: &str) -> Result<bool, GrammarError> {
    match field(object, key) {
        None => Ok(default),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| invalid(&format!("{path}.{key}"), "must be a boolean")),
    }
}

/// Whether a free format watches for strings or, its `token_` form, for special tokens (its
/// text is the same: characters and special tokens).
#[derive(Clone, Copy)]
enum Level {
    Text,
    Token,
}

impl Level {
    fn of(kind: &str) -> Level {
        match kind.starts_with("token_") || kind == "any_tokens" {
            true => Level::Token,
            false => Level::Text,
        }
    }
}

struct Reader<'a> {
    vocab: &'a Vocabulary,
    /// The special tokens' names.
    names: Vec<(&'a str, u32)>,
}

impl Reader<'_> {
    fn format(&self, value: &Value, path: &str, depth: usize) -> Result<Format, GrammarError> {
        if depth > MAX_DEPTH {
            return Err(invalid(path, format!("formats nest deeper than {MAX_DEPTH}")));
        }
        let f = object(value, path)?;
        let kind = field(f, "type").and_then(Value::as_str).unwrap_or_default();
        let at = |key: &str| format!("{path}.{key}");
        let text = |key: &str| string(required(f, key, path)?, &at(key));
        let formats = |key: &str| {
            array(required(f, key, path)?, &at(key))?
                .iter()
                .enumerate()
                .map(|(i, e)| self.format(e, &format!("{path}.{key}[{i}]"), depth + 1))
                .collect::<Result<Vec<Format>, GrammarError>>()
        };
        let repeat = |min: u32, max: Option<u32>| -> Result<Format, GrammarError> {
            Ok(Format::Repeat {
                content: Box::new(self.format(required(f, "content", path)?, &at("content"), depth + 1)?),
                min,
                max,
            })
        };
        match kind {
            "const_string" => Ok(Format::Literal(self.literal(text("value")?))),
            "json_schema" => self.json_schema(f, path),
            "grammar" => Ok(Format::Grammar(text("grammar")?.into())),
            "regex" => Ok(Format::Regex(text("pattern")?.into())),
            "any_text" | "any_tokens" => {
                for limit in ["max_tokens", "max_chars"] {
                    if field(f, limit).is_some() {
                        return Err(invalid(&at(limit), "is not supported"));
                    }
                }
                Ok(Format::FreeText {
                    excludes: self.excludes(f, path, Level::of(kind))?,
                    dispatch: Vec::new(),
                    again: true,
                    any_token: true,
                })
            }
            "sequence" => Ok(Format::Sequence(formats("elements")?)),
            "or" => Ok(Format::Or(formats("elements")?)),
            "optional" => repeat(0, Some(1)),
            "plus" => repeat(1, None),
            "star" => repeat(0, None),
            "repeat" => {
                let count = |key: &str| field(f, key).and_then(Value::as_i64);
                let min = count("min")
                    .and_then(|m| u32::try_from(m).ok())
                    .ok_or_else(|| invalid(&at("min"), "must be a count"))?;
                let max = match count("max") {
                    Some(-1) => None,
                    Some(m) => Some(
                        u32::try_from(m)
                            .ok()
                            .filter(|&m| m >= min)
                            .ok_or_else(|| invalid(&at("max"), "must be -1 or at least min"))?,
                    ),
                    None => return Err(invalid(&at("max"), "must be a count, or -1 for no limit")),
                };
                repeat(min, max)
            }
            "tag" => Ok(Format::Tag(self.tag(value, path, depth)?)),
            "triggered_tags" | "token_triggered_tags" => self.triggered_tags(f, path, depth, Level::of(kind)),
            "tags_with_separator" => {
                let tags = self.tags(f, path, depth)?;
                let separator = self.literal(text("separator")?);
                let one = Format::Or(tags.into_iter().map(Format::Tag).collect());
                let first_only = flag(f, "stop_after_first", false, path)?;
                let some = match first_only {
                    true => one,
                    false => Format::Sequence(vec![
                        one.clone(),
                        Format::Sequence(vec![Format::Literal(separator), one]).star(),
                    ]),
                };
                Ok(match flag(f, "at_least_one", false, path)? {
                    true => some,
                    false => Format::Repeat {
                        content: Box::new(some),
                        min: 0,
                        max: Some(1),
                    },
                })
            }
            "dispatch" | "token_dispatch" => {
                let level = Level::of(kind);
                let rules = array(required(f, "rules", path)?, &at("rules"))?;
                let dispatch = rules
                    .iter()
                    .enumerate()
                    .map(|(i, rule)| {
                        let here = format!("{path}.rules[{i}]");
                        match rule.as_array().map(Vec::as_slice) {
                            Some([pattern, format]) => Ok((
                                self.watched(pattern, &format!("{here}[0]"), level)?,
                                self.format(format, &format!("{here}[1]"), depth + 1)?,
                            )),
                            _ => Err(invalid(&here, "must be a [pattern, format] pair")),
                        }
                    })
                    .collect::<Result<Vec<_>, GrammarError>>()?;
                Ok(Format::FreeText {
                    excludes: self.excludes(f, path, level)?,
                    dispatch,
                    again: flag(f, "loop", true, path)?,
                    any_token: true,
                })
            }
            "token" => Ok(Format::Literal(Literal::token(
                self.token(required(f, "token", path)?, &at("token"))?,
            ))),
            "exclude_token" => Err(invalid(
                path,
                "exclude_token is not supported: a grammar over text cannot tell one token from several",
            )),
            "" => Err(invalid(path, "type is required")),
            other => Err(invalid(path, format!("unknown format type {other:?}"))),
        }
    }

    fn json_schema(&self, f: &Map<String, Value>, path: &str) -> Result<Format, GrammarError> {
        if let Some(style) = field(f, "style").filter(|s| s.as_str() != Some("json")) {
            return Err(invalid(
                &format!("{path}.style"),
                format!("{style} is not supported (only \"json\")"),
            ));
        }
        if flag(f, "any_order", false, path)? {
            return Err(invalid(&format!("{path}.any_order"), "is not supported"));
        }
        schema(required(f, "json_schema", path)?, &format!("{path}.json_schema"))
    }

    /// `{"begin", "content", "end"}`: begin a string or a token, end a string, several
    /// strings or a token.
    fn tag(&self, value: &Value, path: &str, depth: usize) -> Result<Tag, GrammarError> {
        let t = object(value, path)?;
        if field(t, "type").is_some_and(|k| k.as_str() != Some("tag")) {
            return Err(invalid(path, "must be a format of type tag"));
        }
        let ends = match required(t, "end", path)? {
            Value::Array(ends) if !ends.is_empty() => ends
                .iter()
                .enumerate()
                .map(|(i, e)| Ok(self.literal(string(e, &format!("{path}.end[{i}]"))?)))
                .collect::<Result<Vec<Literal>, GrammarError>>()?,
            end => vec![self.mark(end, &format!("{path}.end"))?],
        };
        Ok(Tag {
            begin: self.mark(required(t, "begin", path)?, &format!("{path}.begin"))?,
            content: Box::new(self.format(required(t, "content", path)?, &format!("{path}.content"), depth + 1)?),
            ends,
        })
    }

    fn tags(&self, f: &Map<String, Value>, path: &str, depth: usize) -> Result<Vec<Tag>, GrammarError> {
        array(required(f, "tags", path)?, &format!("{path}.tags"))?
            .iter()
            .enumerate()
            .map(|(i, t)| self.tag(t, &format!("{path}.tags[{i}]"), depth + 1))
            .collect()
    }

    /// Free text in which each trigger starts one of the tags that begin with it.
    fn triggered_tags(
        &self,
        f: &Map<String, Value>,
        path: &str,
        depth: usize,
        level: Level,
    ) -> Result<Format, GrammarError> {
        let key = match level {
            Level::Text => "triggers",
            Level::Token => "trigger_tokens",
        };
        let triggers = array(required(f, key, path)?, &format!("{path}.{key}"))?;
        let triggers = self.watched_all(triggers, &format!("{path}.{key}"), level)?;
        let tags = self.tags(f, path, depth)?;
        let dispatch = dispatch_by_trigger(triggers, &tags, path)?;
        let excludes = self.excludes(f, path, level)?;
        let first_only = flag(f, "stop_after_first", false, path)?;
        if !flag(f, "at_least_one", false, path)? {
            return Ok(Format::FreeText {
                excludes,
                dispatch,
                again: !first_only,
                any_token: true,
            });
        }
        // A tag first, no text before it.
        let first = Format::Or(tags.into_iter().map(Format::Tag).collect());
        Ok(match first_only {
            true => first,
            false => Format::Sequence(vec![
                first,
                Format::FreeText {
                    excludes,
                    dispatch,
                    again: true,
                    any_token: true,
                },
            ]),
        })
    }

    /// The older shape: `structures` of `{"begin", "schema", "end"}`, each started by one of
    /// `triggers` in free text.
    fn structures(&self, structures: &Value, triggers: Option<&Value>) -> Result<Format, GrammarError> {
        let tags = array(structures, "structures")?
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let path = format!("structures[{i}]");
                let s = object(s, &path)?;
                let text = |key: &str| -> Result<Literal, GrammarError> {
                    Ok(self.literal(string(required(s, key, &path)?, &format!("{path}.{key}"))?))
                };
                Ok(Tag {
                    begin: text("begin")?,
                    content: Box::new(schema(required(s, "schema", &path)?, &format!("{path}.schema"))?),
                    ends: vec![text("end")?],
                })
            })
            .collect::<Result<Vec<Tag>, GrammarError>>()?;
        let triggers = array(triggers.unwrap_or(&Value::Null), "triggers")?;
        let triggers = self.watched_all(triggers, "triggers", Level::Text)?;
        Ok(Format::FreeText {
            excludes: Vec::new(),
            dispatch: dispatch_by_trigger(triggers, &tags, "structural_tag")?,
            again: true,
            any_token: true,
        })
    }

    /// A tag's begin or end: a string, or a token format.
    fn mark(&self, value: &Value, path: &str) -> Result<Literal, GrammarError> {
        match value {
            Value::String(text) => Ok(self.literal(text)),
            Value::Object(m) if m.get("type").and_then(Value::as_str) == Some("token") => Ok(Literal::token(
                self.token(required(m, "token", path)?, &format!("{path}.token"))?,
            )),
            _ => Err(invalid(path, "must be a string or a token format")),
        }
    }

    /// A string that free text watches for: not empty.
    fn pattern(&self, value: &Value, path: &str) -> Result<Literal, GrammarError> {
        let literal = self.literal(string(value, path)?);
        match literal.0.is_empty() {
            true => Err(invalid(path, "must not be empty")),
            false => Ok(literal),
        }
    }

    /// A string free text watches for, or at the token level a special token.
    fn watched(&self, value: &Value, path: &str, level: Level) -> Result<Literal, GrammarError> {
        match level {
            Level::Text => self.pattern(value, path),
            Level::Token => Ok(Literal::token(self.token(value, path)?)),
        }
    }

    /// What free text may not hold: `excludes` (strings), or at the token level
    /// `exclude_tokens`.
    fn excludes(&self, f: &Map<String, Value>, path: &str, level: Level) -> Result<Vec<Literal>, GrammarError> {
        let key = match level {
            Level::Text => "excludes",
            Level::Token => "exclude_tokens",
        };
        let Some(excludes) = field(f, key) else {
            return Ok(Vec::new());
        };
        let excludes = excludes
            .as_array()
            .ok_or_else(|| invalid(&format!("{path}.{key}"), "must be an array"))?;
        self.watched_all(excludes, &format!("{path}.{key}"), level)
    }

    /// Each of `values` (the array at `path`) as `watched` reads it.
    fn watched_all(&self, values: &[Value], path: &str, level: Level) -> Result<Vec<Literal>, GrammarError> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| self.watched(v, &format!("{path}[{i}]"), level))
            .collect()
    }

    /// `text`, the special tokens it names as those tokens.
    fn literal(&self, text: &str) -> Literal {
        Literal::named(text, &self.names)
    }

    /// A special token by id or name.
    fn token(&self, value: &Value, path: &str) -> Result<u32, GrammarError> {
        match value {
            Value::String(name) => self
                .names
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, id)| *id)
                .ok_or_else(|| invalid(path, format!("{name:?} names no special token of this model"))),
            Value::Number(n) => n
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .filter(|&id| self.vocab.is_spelled_by_id(id))
                .ok_or_else(|| invalid(path, format!("{n} is no special token of this model"))),
            _ => Err(invalid(path, "must be a token id or a special token's name")),
        }
    }
}

/// A JSON schema format's schema: an object or a boolean.
fn schema(value: &Value, path: &str) -> Result<Format, GrammarError> {
    match value {
        Value::Object(_) | Value::Bool(_) => Ok(Format::Json(value.clone())),
        _ => Err(invalid(path, "must be a JSON schema object")),
    }
}

/// Free text's dispatch where each trigger starts one of the tags whose begin it begins (the
/// rest of that begin, the content, an end). Every tag must begin with a trigger, and every
/// trigger must begin a tag.
fn dispatch_by_trigger(
    triggers: Vec<Literal>,
    tags: &[Tag],
    path: &str,
) -> Result<Vec<(Literal, Format)>, GrammarError> {
    let starts = |tag: &Tag, trigger: &Literal| tag.begin.0.starts_with(&trigger.0);
    if let Some(tag) = tags.iter().find(|tag| !triggers.iter().any(|t| starts(tag, t))) {
        return Err(invalid(path, format!("no trigger begins the tag {}", tag.begin)));
    }
    let mut dispatch: Vec<(Literal, Format)> = Vec::new();
    for trigger in triggers {
        if dispatch.iter().any(|(t, _)| *t == trigger) {
            continue;
        }
        let rests: Vec<Format> = tags
            .iter()
            .filter(|tag| starts(tag, &trigger))
            .map(|tag| {
                Format::Tag(Tag {
                    begin: Literal(tag.begin.0[trigger.0.len()..].to_vec()),
                    ..tag.clone()
                })
            })
            .collect();
        if rests.is_empty() {
            return Err(invalid(path, format!("the trigger {trigger} begins no tag")));
        }
        dispatch.push((trigger, Format::Or(rests)));
    }
    Ok(dispatch)
}

#[cfg(test)]
#[path = "structural_tag_tests.rs"]
mod tests;

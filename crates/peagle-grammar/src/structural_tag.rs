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
mod tests {
    use super::*;
    use crate::grammar::Grammar;
    use crate::spec::Spec;
    use serde_json::json;

    const CHANNEL: u32 = 1;
    const MESSAGE: u32 = 2;
    const END: u32 = 3;
    const START: u32 = 6;

    /// Text tokens "a" and "<", then `<|channel|>`, `<|message|>`, `<|end|>`, `<|start|>`
    /// (special), and `<|ch` (a special token whose name begins another's).
    fn vocab() -> Vocabulary {
        let text = |t: &str| Some(t.as_bytes().to_vec());
        Vocabulary::new(vec![text("a"), None, None, None, None, text("<"), None]).with_special_names([
            ("<|channel|>".to_string(), CHANNEL),
            ("<|message|>".to_string(), MESSAGE),
            ("<|end|>".to_string(), END),
            ("<|ch".to_string(), 4),
            ("<".to_string(), 5),
            ("<|start|>".to_string(), START),
        ])
    }

    fn compile(tag: Value) -> Result<Grammar, GrammarError> {
        Spec::StructuralTag(tag).compile(&vocab())
    }

    /// `text` with the special tokens' names spelled as the tokens.
    fn spelled(text: &str) -> Vec<u8> {
        let names = [
            ("<|channel|>", CHANNEL),
            ("<|message|>", MESSAGE),
            ("<|end|>", END),
            ("<|start|>", START),
        ];
        Literal::named(text, &names).bytes()
    }

    fn accepts(g: &Grammar, text: &str) -> bool {
        g.advance_bytes(&g.start(), &spelled(text)).accepts()
    }

    fn weather_tag() -> Value {
        json!({"type": "tag", "begin": "<function=get_weather>",
               "content": {"type": "json_schema", "json_schema": {"type": "object", "properties": {"city": {"enum": ["Oslo"]}},
                           "required": ["city"], "additionalProperties": false}},
               "end": "</function>"})
    }

    fn triggered(at_least_one: bool, stop_after_first: bool) -> Grammar {
        let time = json!({"type": "tag", "begin": "<function=get_time>", "content": {"type": "const_string", "value": "{}"}, "end": "</function>"});
        compile(json!({"type": "structural_tag", "format": {
            "type": "triggered_tags", "triggers": ["<function="], "tags": [weather_tag(), time],
            "at_least_one": at_least_one, "stop_after_first": stop_after_first}}))
        .unwrap()
    }

    const CALL: &str = r#"<function=get_weather>{"city": "Oslo"}</function>"#;

    #[test]
    fn triggered_tags_hold_calls_in_free_text() {
        let g = triggered(false, false);
        assert!(accepts(&g, "") && accepts(&g, "No call. <function"));
        assert!(accepts(
            &g,
            &format!("I will call. {CALL} and <function=get_time>{{}}</function> done")
        ));
        assert!(
            !accepts(&g, "<function=get_rain>{}</function>"),
            "only the tags' functions"
        );
        assert!(
            !accepts(&g, r#"<function=get_weather>{"city": "Rome"}</function>"#),
            "arguments by schema"
        );
        assert!(!accepts(&g, "<function=get_weather>"), "a call is whole");

        let first_only = triggered(false, true);
        assert!(accepts(&first_only, &format!("text {CALL}")));
        assert!(!accepts(&first_only, &format!("text {CALL} more")));

        let required = triggered(true, false);
        assert!(!accepts(&required, "") && !accepts(&required, &format!("text {CALL}")));
        assert!(accepts(&required, &format!("{CALL} then text {CALL}")));

        let exactly_one = triggered(true, true);
        assert!(accepts(&exactly_one, CALL) && !accepts(&exactly_one, &format!("{CALL} ")));
    }

    /// The older shape: structures with schemas, and their triggers.
    #[test]
    fn structures_and_triggers_are_triggered_tags() {
        let g = compile(json!({"type": "structural_tag",
            "structures": [{"begin": "<function=get_weather>", "schema": weather_tag()["content"]["json_schema"], "end": "</function>"}],
            "triggers": ["<function="]}))
        .unwrap();
        assert!(accepts(&g, &format!("Calling {CALL}.")));
        assert!(!accepts(&g, "<function=x>"));
    }

    /// Strings naming special tokens mean the tokens (the longest name where names overlap),
    /// and free text inside a tag stops at its end: harmony's analysis message, then a final
    /// one in JSON.
    #[test]
    fn special_token_names_in_strings_are_the_tokens() {
        let g = compile(json!({"format": {"type": "sequence", "elements": [
            {"type": "tag", "begin": "<|channel|>analysis<|message|>", "content": {"type": "any_text"}, "end": "<|end|>"},
            {"type": "tag", "begin": {"type": "token", "token": "<|channel|>"}, "content": {"type": "const_string", "value": "final"},
             "end": {"type": "token", "token": MESSAGE}},
            {"type": "json_schema", "json_schema": {"type": "integer"}}]}}))
        .unwrap();
        assert!(accepts(
            &g,
            "<|channel|>analysis<|message|>Think: a < b.<|end|><|channel|>final<|message|>42"
        ));
        let spelled_out = [
            b"<|channel|>".as_slice(),
            &spelled("analysis<|message|>x<|end|><|channel|>final<|message|>1"),
        ]
        .concat();
        assert!(
            !g.advance_bytes(&g.start(), &spelled_out).accepts(),
            "a name's text is not its token"
        );
        assert!(!accepts(
            &g,
            "<|channel|>analysis<|message|>x<|end|>y<|end|><|channel|>final<|message|>1"
        ));
    }

    /// Free text holds special tokens too, as xgrammar's text holds their names: harmony's
    /// analysis messages, which a trigger holds to their syntax, between the other messages.
    #[test]
    fn free_text_holds_special_tokens_between_triggered_tags() {
        let g = compile(json!({"type": "structural_tag", "format": {"type": "triggered_tags",
            "triggers": ["<|channel|>analysis"],
            "tags": [{"begin": "<|channel|>analysis<|message|>", "content": {"type": "any_text"}, "end": "<|end|>"}]}}))
        .unwrap();
        assert!(accepts(
            &g,
            "<|channel|>analysis<|message|>a < b<|end|><|start|>assistant<|channel|>final<|message|>ok"
        ));
        assert!(accepts(&g, "<|start|>x<|channel|>commentary<|message|>y<|end|>"));
        assert!(
            !accepts(&g, "<|channel|>analysis<|start|>"),
            "the trigger holds its tag"
        );
        assert!(!accepts(&g, "<|channel|>analysis<|message|>a"), "the tag is whole");
    }

    /// The token-level free formats watch for special tokens.
    #[test]
    fn token_level_formats_watch_for_special_tokens() {
        let triggered = compile(json!({"format": {"type": "token_triggered_tags", "trigger_tokens": ["<|channel|>"],
            "tags": [{"type": "tag", "begin": {"type": "token", "token": CHANNEL}, "content": {"type": "const_string", "value": "x"},
                      "end": {"type": "token", "token": "<|end|>"}}],
            "exclude_tokens": ["<|start|>"]}}))
        .unwrap();
        assert!(accepts(&triggered, "a<|channel|>x<|end|>b<|message|>"));
        assert!(!accepts(&triggered, "a<|channel|>y<|end|>") && !accepts(&triggered, "a<|start|>"));
        let dispatch = compile(json!({"format": {"type": "token_dispatch", "loop": false,
            "rules": [["<|message|>", {"type": "const_string", "value": "!"}]]}}))
        .unwrap();
        assert!(accepts(&dispatch, "a<|end|><|message|>!") && !accepts(&dispatch, "a<|message|>!b"));
        let any = compile(json!({"format": {"type": "any_tokens", "exclude_tokens": [END]}})).unwrap();
        assert!(accepts(&any, "a<|start|>b<|channel|>") && !accepts(&any, "a<|end|>"));
    }

    #[test]
    fn tags_with_separator_and_dispatch() {
        let list = |at_least_one: bool, stop_after_first: bool| {
            compile(
                json!({"format": {"type": "tags_with_separator", "tags": [weather_tag()], "separator": ",",
                                      "at_least_one": at_least_one, "stop_after_first": stop_after_first}}),
            )
            .unwrap()
        };
        let two = format!("{CALL},{CALL}");
        assert!(accepts(&list(false, false), "") && accepts(&list(false, false), &two));
        assert!(!accepts(&list(true, false), "") && accepts(&list(true, false), &two));
        assert!(
            !accepts(&list(true, false), &format!("{CALL} ")),
            "no text outside the tags"
        );
        assert!(accepts(&list(false, true), "") && !accepts(&list(false, true), &two));
        assert!(accepts(&list(true, true), CALL));

        let dispatch = |looping: bool| {
            compile(
                json!({"format": {"type": "dispatch", "loop": looping, "excludes": ["STOP"],
                "rules": [["<n>", {"type": "regex", "pattern": "[0-9]+</n>"}]]}}),
            )
            .unwrap()
        };
        assert!(accepts(&dispatch(true), "a <n>12</n> b <n>3</n>"));
        assert!(!accepts(&dispatch(true), "a STOP"), "an excluded string");
        assert!(accepts(&dispatch(false), "a <n>1</n>") && !accepts(&dispatch(false), "a <n>1</n>b"));
    }

    #[test]
    fn composition_formats() {
        let g = compile(json!({"format": {"type": "sequence", "elements": [
            {"type": "optional", "content": {"type": "const_string", "value": "-"}},
            {"type": "plus", "content": {"type": "or", "elements": [{"type": "const_string", "value": "ab"}, {"type": "regex", "pattern": "c"}]}},
            {"type": "repeat", "min": 1, "max": 2, "content": {"type": "grammar", "grammar": "root ::= [xy]"}},
            {"type": "star", "content": {"type": "const_string", "value": "!"}}]}}))
        .unwrap();
        assert!(accepts(&g, "-abcx") && accepts(&g, "cxy!!"));
        assert!(!accepts(&g, "x") && !accepts(&g, "abxyx") && !accepts(&g, "--abx"));
    }

    /// What cannot be read is refused, saying where.
    #[test]
    fn unsupported_and_malformed_tags_are_refused() {
        let refused = |format: Value, says: &str| {
            let err = compile(json!({"format": format})).unwrap_err().to_string();
            assert!(err.contains(says), "{err} does not say {says}");
        };
        refused(
            json!({"type": "exclude_token"}),
            "format: exclude_token is not supported",
        );
        refused(
            json!({"type": "any_tokens", "max_tokens": 3}),
            "format.max_tokens: is not supported",
        );
        refused(
            json!({"type": "token_dispatch", "rules": [[0, {"type": "const_string", "value": "x"}]]}),
            "format.rules[0][0]: 0 is no special token",
        );
        refused(
            json!({"type": "any_text", "max_tokens": 5}),
            "format.max_tokens: is not supported",
        );
        refused(
            json!({"type": "json_schema", "json_schema": {}, "style": "qwen_xml"}),
            "format.style",
        );
        refused(
            json!({"type": "json_schema", "json_schema": {}, "any_order": true}),
            "format.any_order",
        );
        refused(json!({"type": "yaml"}), "unknown format type \"yaml\"");
        refused(json!({"value": "x"}), "format: type is required");
        refused(
            json!({"type": "sequence", "elements": [{"type": "const_string"}]}),
            "format.elements[0]: value is required",
        );
        refused(
            json!({"type": "repeat", "min": 3, "max": 2, "content": {"type": "const_string", "value": "x"}}),
            "format.max",
        );
        refused(json!({"type": "token", "token": "<|nope|>"}), "names no special token");
        refused(json!({"type": "token", "token": 0}), "0 is no special token");
        refused(
            json!({"type": "triggered_tags", "triggers": ["<f="], "tags": [weather_tag()]}),
            "no trigger begins the tag \"<function=get_weather>\"",
        );
        refused(
            json!({"type": "triggered_tags", "triggers": ["<function=", "<x"], "tags": [weather_tag()]}),
            "the trigger \"<x\" begins no tag",
        );
        refused(
            json!({"type": "triggered_tags", "triggers": [""], "tags": [weather_tag()]}),
            "format.triggers[0]: must not be empty",
        );
        refused(
            json!({"type": "dispatch", "rules": [["a"]]}),
            "format.rules[0]: must be a [pattern, format] pair",
        );
        let mut deep = json!({"type": "const_string", "value": "x"});
        for _ in 0..100 {
            deep = json!({"type": "optional", "content": deep});
        }
        refused(deep, "formats nest deeper than 64");
        let err = compile(json!({"type": "structural_tag"})).unwrap_err().to_string();
        assert!(err.contains("give its format"), "{err}");
    }
}

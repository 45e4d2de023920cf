//! JSON schemas (and "any JSON object") to grammars, for `response_format` and `guided_json`.
//!
//! What is supported, and how the text looks:
//! - `type` (one or a list), `enum`, `const`, `anyOf`, `oneOf` (as anyOf), `allOf` of one
//!   schema, local `$ref`s (`#`, `#/$defs/...`, any JSON pointer into the schema; recursion
//!   included), `true` and `{}` for any value.
//! - Objects: `properties` in the order the schema lists them, each required one present,
//!   optional ones possibly left out; `additionalProperties` false, true or a schema. Left out,
//!   it allows no other property where `properties` are listed and any where none are (as
//!   OpenAI's strict mode and xgrammar have it). Other members come after the listed ones;
//!   their names are none of the listed ones (each character spelled as serde_json writes
//!   it, so no other spelling of one gets past), but a grammar does not keep them from
//!   repeating each other.
//! - Arrays: `items`, `prefixItems`, `minItems`, `maxItems`.
//! - Strings: `minLength`, `maxLength`, `pattern` (matching the whole string), and `format`
//!   date, time, date-time, uuid, email and ipv4 (other formats are annotations, as JSON
//!   Schema allows).
//! - Numbers: any JSON number, integers without fraction or exponent, at most 16 integral
//!   digits (and 16 decimals), so that a model cannot run on forever in one number, and
//!   positive exponents up to 292, so that every number is a finite double. Numbers
//!   and integers take `minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum`
//!   (numbers, or draft 4's booleans); a bounded number is written without an exponent.
//! - Whitespace between tokens: nothing, a space, or a newline and up to 40 spaces or tabs of
//!   indentation (unless the request gives its own pattern).
//!
//! Keywords that assert what the grammar cannot (`multipleOf`, `uniqueItems`, `not`, ...)
//! are refused with the keyword named, unless their value asserts nothing
//! (`uniqueItems: false`, `minProperties: 0`, empty `patternProperties`, ...); keywords unknown to JSON Schema are ignored, as the
//! specification says.

use crate::bounds::{highest_integer, lowest_integer, numeric_bounds, BOUNDS};
use crate::error::GrammarError;
use crate::grammar::{Element, Grammar, GrammarBuilder, RuleId};
use crate::int_range::int_range_pattern;
use crate::number_range::number_range_pattern;
use crate::regex::{self, Chars};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Asserting keywords the grammar does not enforce: a schema with one is refused.
const UNSUPPORTED: &[&str] = &[
    "multipleOf",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
];

/// The default whitespace between JSON tokens.
const WHITESPACE: &str = r"( |\n[ \t]{0,40})?";

/// A grammar for JSON text that `schema` accepts; `whitespace` is the pattern between tokens.
pub fn schema_grammar(schema: &Value, whitespace: Option<&str>) -> Result<Grammar, GrammarError> {
    let mut b = GrammarBuilder::new();
    let root = schema_element(&mut b, schema, whitespace)?;
    b.finish(vec![root])
}

/// The element of `b` matching JSON text that `schema` accepts, for a grammar with the JSON
/// inside it; `whitespace` is the pattern between tokens.
pub fn schema_element(
    b: &mut GrammarBuilder,
    schema: &Value,
    whitespace: Option<&str>,
) -> Result<Element, GrammarError> {
    JsonCompiler::new(b, schema, whitespace)?.schema(schema, "#")
}

/// A grammar for any JSON object (`response_format: {"type": "json_object"}`).
pub fn object_grammar(whitespace: Option<&str>) -> Result<Grammar, GrammarError> {
    let mut b = GrammarBuilder::new();
    let root = JsonCompiler::new(&mut b, &Value::Null, whitespace)?.any_object()?;
    b.finish(vec![root])
}

struct JsonCompiler<'a> {
    b: &'a mut GrammarBuilder,
    root: &'a Value,
    ws: Element,
    refs: HashMap<String, RuleId>,
    primitives: HashMap<&'static str, Element>,
    any_value: Option<RuleId>,
    /// How many schemas deep the compiler is (subschemas and references followed).
    depth: usize,
}

/// The deepest a schema may nest, references followed included: deeper ones (a chain of
/// thousands of `$ref`s, say) are refused rather than compiled recursively.
const MAX_NESTING: usize = 128;

fn err(path: &str, why: impl Into<String>) -> GrammarError {
    GrammarError::Schema {
        path: path.to_string(),
        why: why.into(),
    }
}

impl<'a> JsonCompiler<'a> {
    fn new(b: &'a mut GrammarBuilder, root: &'a Value, whitespace: Option<&str>) -> Result<Self, GrammarError> {
        let ws = regex::compile(b, whitespace.unwrap_or(WHITESPACE), Chars::Raw)?;
        let ws = b.rule(vec![ws])?;
        Ok(Self {
            b,
            root,
            ws,
            refs: HashMap::new(),
            primitives: HashMap::new(),
            any_value: None,
            depth: 0,
        })
    }

    fn schema(&mut self, schema: &Value, path: &str) -> Result<Element, GrammarError> {
        if self.depth >= MAX_NESTING {
            return Err(err(path, format!("schemas nest deeper than {MAX_NESTING}")));
        }
        self.depth += 1;
        let element = self.subschema(schema, path);
        self.depth -= 1;
        element
    }

    fn subschema(&mut self, schema: &Value, path: &str) -> Result<Element, GrammarError> {
        let object = match schema {
            Value::Bool(true) => return self.any_value(),
            Value::Bool(false) => return Err(err(path, "the schema `false` matches nothing")),
            Value::Object(object) => object,
            _ => return Err(err(path, "a schema must be an object or a boolean")),
        };
        let asserts = |k: &&&str| object.get(**k).is_some_and(|v| !asserts_nothing(k, v));
        if let Some(keyword) = UNSUPPORTED.iter().find(asserts) {
            return Err(GrammarError::SchemaKeyword {
                path: path.to_string(),
                keyword: keyword.to_string(),
            });
        }
        if let Some(reference) = object.get("$ref") {
            only_annotations_beside(object, "$ref", path)?;
            return self.reference(reference, path);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = object.get(key) {
                only_annotations_beside(object, key, path)?;
                return self.any_of(options, &format!("{path}/{key}"));
            }
        }
        if let Some(all) = object.get("allOf") {
            only_annotations_beside(object, "allOf", path)?;
            return match all.as_array().map(Vec::as_slice) {
                Some([one]) => self.schema(one, &format!("{path}/allOf/0")),
                _ => Err(GrammarError::SchemaKeyword {
                    path: path.to_string(),
                    keyword: "allOf (of more than one schema)".into(),
                }),
            };
        }
        // A const or enum is its values, those of the schema's `type` where it has one (the
        // other keywords beside them are not checked against the values).
        let values = match (object.get("const"), object.get("enum")) {
            (Some(value), _) => Some(std::slice::from_ref(value)),
            (None, Some(values)) => Some(
                values
                    .as_array()
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| err(path, "enum must be a non-empty array"))?
                    .as_slice(),
            ),
            (None, None) => None,
        };
        if let Some(values) = values {
            let types: Vec<&str> = match object.get("type") {
                Some(Value::String(t)) => vec![t.as_str()],
                Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            let typed = |v: &&Value| types.is_empty() || types.iter().any(|t| has_type(v, t));
            let values: Vec<&Value> = values.iter().filter(typed).collect();
            if values.is_empty() {
                return Err(err(path, "no value of const or enum has the schema's type"));
            }
            // Scalars as a trie of their texts; objects and arrays with whitespace between
            // their tokens, as any other JSON the grammar writes.
            let (containers, scalars): (Vec<&Value>, Vec<&Value>) =
                values.into_iter().partition(|v| v.is_object() || v.is_array());
            let texts: Vec<String> = scalars.into_iter().map(json_text).collect();
            let texts: Vec<&[u8]> = texts.iter().map(|t| t.as_bytes()).collect();
            let mut alternatives = Vec::new();
            if !texts.is_empty() {
                alternatives.push(vec![self.b.one_of(&texts)?]);
            }
            for value in containers {
                alternatives.push(vec![self.value(value)?]);
            }
            return self.b.rule(alternatives);
        }
        match object.get("type") {
            None => self.untyped(object, path),
            Some(Value::String(t)) => self.typed(t, object, path),
            Some(Value::Array(types)) if !types.is_empty() => {
                let mut alternatives = Vec::new();
                for t in types {
                    let t = t
                        .as_str()
                        .ok_or_else(|| err(path, "type must be a string or a list of strings"))?;
                    alternatives.push(vec![self.typed(t, object, path)?]);
                }
                self.b.rule(alternatives)
            }
            Some(_) => Err(err(path, "type must be a string or a non-empty list of strings")),
        }
    }

    /// A schema without `type`: an object or array where its keywords say so, else any value.
    fn untyped(&mut self, object: &Map<String, Value>, path: &str) -> Result<Element, GrammarError> {
        let has = |keys: &[&str]| keys.iter().any(|k| object.contains_key(*k));
        if has(BOUNDS) {
            return Err(GrammarError::SchemaKeyword {
                path: path.to_string(),
                keyword: "numeric bounds without \"type\": \"integer\"".into(),
            });
        }
        if has(&["properties", "required", "additionalProperties"]) {
            self.typed("object", object, path)
        } else if has(&["items", "prefixItems", "minItems", "maxItems"]) {
            self.typed("array", object, path)
        } else if has(&["minLength", "maxLength", "pattern"]) {
            self.typed("string", object, path)
        } else {
            self.any_value()
        }
    }

    fn typed(&mut self, t: &str, object: &Map<String, Value>, path: &str) -> Result<Element, GrammarError> {
        match t {
            "object" => self.object(object, path),
            "array" => self.array(object, path),
            "string" => self.string(object, path),
            "number" | "integer" => match numeric_bounds(object, path)? {
                None => self.primitive(if t == "number" { "number" } else { "integer" }),
                Some((lo, hi)) => {
                    let pattern = match t {
                        "number" => number_range_pattern(lo, hi),
                        _ => int_range_pattern(lo.map(lowest_integer), hi.map(highest_integer)),
                    };
                    let pattern = pattern.ok_or_else(|| err(path, format!("no {t} is within the bounds")))?;
                    let seq = regex::compile(self.b, &pattern, Chars::Raw)?;
                    self.b.unit(seq)
                }
            },
            "boolean" => self.primitive("boolean"),
            "null" => self.primitive("null"),
            other => Err(err(path, format!("unknown type {other:?}"))),
        }
    }

    fn reference(&mut self, reference: &Value, path: &str) -> Result<Element, GrammarError> {
        let reference = reference.as_str().ok_or_else(|| err(path, "$ref must be a string"))?;
        if let Some(&id) = self.refs.get(reference) {
            return Ok(Element::Rule(id));
        }
        let pointer = reference.strip_prefix('#').ok_or_else(|| {
            err(
                path,
                format!("only references inside the schema (#...) are supported, not {reference:?}"),
            )
        })?;
        let target = self
            .root
            .pointer(pointer)
            .ok_or_else(|| err(path, format!("$ref {reference:?} names nothing in the schema")))?;
        let id = self.b.reserve();
        self.refs.insert(reference.to_string(), id);
        let element = self.schema(target, reference)?;
        self.b.define(id, vec![vec![element]])?;
        Ok(Element::Rule(id))
    }

    fn any_of(&mut self, options: &Value, path: &str) -> Result<Element, GrammarError> {
        let options = options
            .as_array()
            .filter(|o| !o.is_empty())
            .ok_or_else(|| err(path, "must be a non-empty array"))?;
        let mut alternatives = Vec::new();
        for (i, option) in options.iter().enumerate() {
            alternatives.push(vec![self.schema(option, &format!("{path}/{i}"))?]);
        }
        self.b.rule(alternatives)
    }

    fn primitive(&mut self, name: &'static str) -> Result<Element, GrammarError> {
        if let Some(&e) = self.primitives.get(name) {
            return Ok(e);
        }
        let seq = match name {
            "string" => {
                let char = self.string_char()?;
                let mut seq = GrammarBuilder::literal(b"\"");
                seq.push(self.b.star(vec![char])?);
                seq.extend(GrammarBuilder::literal(b"\""));
                seq
            }
            "number" => regex::compile(
                self.b,
                r"-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE](-[0-9]{1,3}|\+?([0-9]{1,2}|1[0-9]{2}|2[0-8][0-9]|29[0-2])))?",
                Chars::Raw,
            )?,
            "integer" => regex::compile(self.b, r"-?(0|[1-9][0-9]{0,15})", Chars::Raw)?,
            "boolean" => regex::compile(self.b, "true|false", Chars::Raw)?,
            "null" => GrammarBuilder::literal(b"null"),
            _ => unreachable!("no primitive {name}"),
        };
        let e = self.b.rule(vec![seq])?;
        self.primitives.insert(name, e);
        Ok(e)
    }

    /// Any JSON value (recursive: objects and arrays hold values).
    fn any_value(&mut self) -> Result<Element, GrammarError> {
        if let Some(id) = self.any_value {
            return Ok(Element::Rule(id));
        }
        let value = self.b.reserve();
        self.any_value = Some(value);
        let value_e = Element::Rule(value);
        let key = self.primitive("string")?;
        let member = self.member(vec![key], value_e)?;
        let object = self.bracketed(b'{', member, b'}')?;
        let array = self.bracketed(b'[', value_e, b']')?;
        let mut alternatives = vec![vec![object], vec![array]];
        for name in ["string", "number", "boolean", "null"] {
            alternatives.push(vec![self.primitive(name)?]);
        }
        self.b.define(value, alternatives)?;
        Ok(value_e)
    }

    fn any_object(&mut self) -> Result<Element, GrammarError> {
        let value = self.any_value()?;
        let key = self.primitive("string")?;
        let member = self.member(vec![key], value)?;
        self.bracketed(b'{', member, b'}')
    }

    /// `open` then `item`s separated by commas, possibly none, then `close`.
    fn bracketed(&mut self, open: u8, item: Element, close: u8) -> Result<Element, GrammarError> {
        let more = self.comma(item);
        let mut some = vec![item, self.b.star(more)?];
        some.push(self.ws);
        let mut seq = GrammarBuilder::literal(&[open]);
        seq.extend([self.ws, self.b.optional(some)?]);
        seq.extend(GrammarBuilder::literal(&[close]));
        self.b.unit(seq)
    }
}

/// Whether an unsupported keyword's value asserts nothing, as generators write them where a
/// constraint is off (`uniqueItems: false`, `minProperties: 0`, no patterns): such a schema
/// is taken.
fn asserts_nothing(keyword: &str, value: &Value) -> bool {
    match keyword {
        "uniqueItems" => value == &Value::Bool(false),
        "minProperties" | "minContains" => value.as_u64() == Some(0),
        "patternProperties" | "dependentRequired" | "dependentSchemas" | "dependencies" => {
            value.as_object().is_some_and(Map::is_empty)
        }
        "propertyNames" | "unevaluatedProperties" | "unevaluatedItems" => {
            value == &Value::Bool(true) || value.as_object().is_some_and(Map::is_empty)
        }
        _ => false,
    }
}

/// A count keyword's value (`minItems`, `maxLength`, ...), if given.
fn count(object: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u32>, GrammarError> {
    let read = |v: &Value| {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| err(path, format!("{key} must be a non-negative integer")))
    };
    object.get(key).map(read).transpose()
}

/// Refuses constraining keywords beside `key` (annotations and unknown keywords aside).
fn only_annotations_beside(object: &Map<String, Value>, key: &str, path: &str) -> Result<(), GrammarError> {
    const CONSTRAINING: &[&str] = &[
        "type",
        "enum",
        "const",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "$ref",
        "anyOf",
        "oneOf",
        "allOf",
    ];
    match object.keys().find(|k| *k != key && CONSTRAINING.contains(&k.as_str())) {
        Some(other) => Err(GrammarError::SchemaKeyword {
            path: path.to_string(),
            keyword: format!("{other} beside {key}"),
        }),
        None => Ok(()),
    }
}

/// Whether `value` is of the JSON Schema type `t` (an integer is a number without a fraction).
fn has_type(value: &Value, t: &str) -> bool {
    match t {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

/// A value as compact JSON text.
fn json_text(value: &Value) -> String {
    serde_json::to_string(value).expect("a JSON value serializes")
}

#[path = "json_containers.rs"]
mod containers;

#[path = "json_strings.rs"]
mod strings;

#[cfg(test)]
#[path = "json_schema_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "json_schema_random_tests.rs"]
mod random_tests;

//! The JSON schema compiler's tests: instances accepted and texts refused, schema by schema.

use super::*;
use serde_json::json;

fn accepts(g: &Grammar, text: &str) -> bool {
    g.advance_bytes(&g.start(), text.as_bytes()).accepts()
}

/// Each schema accepts its valid instances written compact and pretty-printed (serde's
/// two-space indentation), and none of the invalid texts.
#[test]
fn schemas_accept_their_instances_and_nothing_else() {
    let cases = [
        (
            json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age"]}),
            vec![
                json!({"name": "Ada", "age": 36}),
                json!({"name": "B\"q\n", "age": -1, "tags": ["x", "y"]}),
                json!({"name": "", "age": 0, "tags": []}),
            ],
            vec![
                r#"{"age": 36, "name": "Ada"}"#,
                r#"{"name": "Ada"}"#,
                r#"{"name": "Ada", "age": 3.5}"#,
                r#"{"name": "Ada", "age": 1, "x": 1}"#,
                r#"{"name": "Ada", "age": 01}"#,
                "{\"name\": \"a\nb\", \"age\": 1}",
            ],
        ),
        (
            json!({"enum": ["red", "green", 3, null]}),
            vec![json!("red"), json!(3), json!(null)],
            vec![r#""blue""#, "4", r#""Red""#],
        ),
        (
            // Objects and arrays among the values take whitespace as any JSON here does.
            json!({"enum": [{"a": [1, {}], "b": []}, "x"]}),
            vec![json!({"a": [1, {}], "b": []}), json!("x")],
            vec![
                r#"{"b": [], "a": [1, {}]}"#,
                r#"{"a": [1, {}]}"#,
                r#"{"a": [1,{},], "b": []}"#,
            ],
        ),
        (
            json!({"type": ["string", "null"], "enum": ["red", 3, null], "const_beside": 1}),
            vec![json!("red"), json!(null)],
            vec!["3"],
        ),
        (
            json!({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}], "title": "Optional"}),
            vec![json!("abc"), json!("日本"), json!(null)],
            vec![r#""abcd""#, "1"],
        ),
        (
            json!({"type": "array", "prefixItems": [{"type": "boolean"}, {"const": "x"}], "items": {"type": "number"}, "minItems": 1, "maxItems": 3}),
            vec![json!([true]), json!([false, "x"]), json!([true, "x", 1.5e3])],
            vec!["[]", r#"[true, "x", 1, 2]"#, r#"["x"]"#, "[true, 2]"],
        ),
        (
            json!({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["value", "next"], "additionalProperties": false}}, "$ref": "#/$defs/node"}),
            vec![json!({"value": 1, "next": {"value": 2, "next": null}})],
            vec![r#"{"value": 1, "next": {"value": 2}}"#, r#"{"value": 1}"#],
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}, "required": ["b"]}),
            vec![
                json!({"b": 1}),
                json!({"a": 1, "b": 2}),
                json!({"b": 2, "c": 3}),
                json!({"a": 1, "b": 2, "c": 3}),
            ],
            vec![
                "{}",
                r#"{"a": 1}"#,
                r#"{"a": 1, "c": 3}"#,
                r#"{"b": 1,}"#,
                r#"{, "b": 1}"#,
            ],
        ),
        (
            json!({"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}, "at": {"type": "string", "format": "date-time"}, "code": {"type": "string", "pattern": "^[A-Z]{2}\\d$"}}, "required": ["id", "at", "code"]}),
            vec![json!({"id": "123e4567-e89b-12d3-a456-426614174000", "at": "2026-12-01T01:07:31Z", "code": "AB1"})],
            vec![
                r#"{"id": "nope", "at": "2026-12-01T01:07:31Z", "code": "AB1"}"#,
                r#"{"id": "123e4567-e89b-12d3-a456-426614174000", "at": "2026-13-01T01:07:31Z", "code": "AB1"}"#,
            ],
        ),
        (
            json!({"type": "array", "items": {"type": "string"}}),
            vec![json!(["😀 é \u{1}"])],
            vec![r#"["\ud800"]"#, r#"["\udc00\ud800"]"#, r#"["\x"]"#],
        ),
        (
            json!({"type": "string", "format": "email", "maxLength": 5}),
            vec![json!("a@b"), json!("not@")],
            vec![r#""abcdef""#],
        ),
        (
            json!({"type": "number"}),
            vec![json!(1.5e200), json!(-2), json!(1e-300)],
            // Past 10^308, which no f64 holds: a positive exponent stops at 292.
            vec!["1e1000", "1e", "1.5e300", "1e293"],
        ),
        (
            json!({"type": "object", "additionalProperties": {"type": "boolean"}}),
            vec![json!({}), json!({"x": true, "y": false})],
            vec![r#"{"x": 1}"#],
        ),
        (
            json!({"type": "object", "properties": {"k": {"type": "integer"}}, "additionalProperties": true}),
            vec![json!({"k": 1, "other": [1, {"deep": null}]}), json!({"free": "x"})],
            vec![r#"{"other" 1}"#, r#"{"k": 1 "x": 2}"#, r#"{"k": 1,}"#],
        ),
        (
            // Other members' names are none of the listed ones, however spelled, each
            // character written one way (as serde_json writes it).
            json!({"type": "object", "properties": {"a": {"type": "integer"}, "é": {"type": "integer"}},
                   "additionalProperties": {"type": "boolean"}}),
            vec![
                json!({"a": 1, "ab": true, "b": false, "": true}),
                json!({"é": 2, "é\n\u{1f}\"": true, "e": false}),
            ],
            vec![
                r#"{"a": 1, "a": true}"#,
                r#"{"a": 1, "\u0061": true}"#,
                r#"{"é": 1, "\u00e9": true}"#,
                r#"{"ab": true, "é": true}"#,
                r#"{"x\u001F": true}"#,
                r#"{"x\/": true}"#,
            ],
        ),
        (
            json!({"type": "object", "properties": {
                "age": {"type": "integer", "minimum": 0, "maximum": 130},
                "delta": {"type": "integer", "exclusiveMinimum": -3.5, "exclusiveMaximum": 2},
                "old": {"type": ["integer", "null"], "minimum": 10, "exclusiveMinimum": true},
                "p": {"type": "number", "minimum": 0, "maximum": 1}
            }, "required": ["age", "delta", "old"]}),
            vec![
                json!({"age": 0, "delta": -3, "old": 11, "p": 0.25}),
                json!({"age": 130, "delta": 1, "old": null, "p": 1}),
            ],
            vec![
                r#"{"age": -1, "delta": 0, "old": 11}"#,
                r#"{"age": 131, "delta": 0, "old": 11}"#,
                r#"{"age": 5, "delta": -4, "old": 11}"#,
                r#"{"age": 5, "delta": 2, "old": 11}"#,
                r#"{"age": 5, "delta": 0, "old": 10}"#,
                r#"{"age": 5, "delta": 0, "old": 11, "p": 1.5}"#,
                r#"{"age": 5, "delta": 0, "old": 11, "p": -0.1}"#,
            ],
        ),
        (
            json!({}),
            vec![json!(1), json!("s"), json!([{"a": [true, null]}]), json!({"e": {}})],
            vec!["nul", "[1,]", "{\"a\"}", "01", "1.", "\"\\x\""],
        ),
    ];
    for (schema, valid, invalid) in cases {
        let g = schema_grammar(&schema, None).unwrap_or_else(|e| panic!("{schema}: {e}"));
        for value in valid {
            for text in [
                serde_json::to_string(&value).unwrap(),
                serde_json::to_string_pretty(&value).unwrap(),
            ] {
                assert!(accepts(&g, &text), "{schema} rejects {text}");
            }
        }
        for text in invalid {
            assert!(!accepts(&g, text), "{schema} accepts {text}");
        }
    }
}

#[test]
fn any_object_is_an_object_only() {
    let g = object_grammar(None).unwrap();
    for text in ["{}", r#"{"a": [1, {"b": "c"}], "d": -0.5e-3}"#, "{\n  \"x\": null\n}"] {
        assert!(accepts(&g, text), "{text}");
    }
    for text in ["[]", "1", r#"{"a" 1}"#, "{} {}", r#"{"a": tru}"#] {
        assert!(!accepts(&g, text), "{text}");
    }
    assert!(accepts(&g, r#"{"e": "\ud83d\ude00"}"#), "a surrogate pair");
    let tight = object_grammar(Some("")).unwrap();
    assert!(accepts(&tight, r#"{"a":1,"b":[2]}"#) && !accepts(&tight, r#"{"a": 1}"#));
}

#[test]
fn unsupported_and_invalid_schemas_are_refused_with_their_place() {
    let refused = |schema: Value| schema_grammar(&schema, None).unwrap_err();
    assert_eq!(
        refused(json!({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}})),
        GrammarError::SchemaKeyword {
            path: "#/properties/n".into(),
            keyword: "multipleOf".into()
        }
    );
    // The same keywords where they assert nothing are taken; where they assert, refused.
    let off = json!({"type": "object", "properties": {"s": {"type": "array", "uniqueItems": false}},
                     "minProperties": 0, "patternProperties": {}, "propertyNames": true});
    assert!(accepts(&schema_grammar(&off, None).unwrap(), r#"{"s": [1, 1]}"#));
    for (keyword, value) in [
        ("uniqueItems", json!(true)),
        ("minProperties", json!(1)),
        ("patternProperties", json!({"^x": {}})),
    ] {
        let mut schema = json!({"type": "object"});
        schema[keyword] = value;
        assert_eq!(
            refused(schema),
            GrammarError::SchemaKeyword {
                path: "#".into(),
                keyword: keyword.into()
            }
        );
    }
    assert!(matches!(
        refused(json!({"type": "number", "minimum": 1, "exclusiveMaximum": 1})),
        GrammarError::Schema { .. }
    ));
    assert!(matches!(
        refused(json!({"minimum": 1})),
        GrammarError::SchemaKeyword { .. }
    ));
    assert!(matches!(
        refused(json!({"type": "integer", "minimum": 3, "maximum": 2})),
        GrammarError::Schema { .. }
    ));
    assert!(matches!(
        refused(json!({"type": "integer", "minimum": "3"})),
        GrammarError::Schema { .. }
    ));
    assert!(matches!(
        refused(json!({"$ref": "#/$defs/missing"})),
        GrammarError::Schema { .. }
    ));
    assert!(matches!(
        refused(json!({"$ref": "https://example.com/s.json"})),
        GrammarError::Schema { .. }
    ));
    assert!(matches!(
        refused(json!({"type": "strnig"})),
        GrammarError::Schema { .. }
    ));
    assert!(matches!(
        refused(json!({"required": ["x"], "properties": {}})),
        GrammarError::Schema { .. }
    ));
    assert!(matches!(
        refused(json!({"allOf": [{"type": "string"}, {"maxLength": 2}]})),
        GrammarError::SchemaKeyword { .. }
    ));
    assert!(matches!(
        refused(json!({"type": "string", "anyOf": [{"maxLength": 2}]})),
        GrammarError::SchemaKeyword { .. }
    ));
    assert!(matches!(refused(json!(false)), GrammarError::Schema { .. }));
    assert!(matches!(
        refused(json!({"type": "string", "const": 3})),
        GrammarError::Schema { .. }
    ));
    assert!(matches!(
        refused(json!({"$ref": "#/$defs/a", "maximum": 3, "$defs": {"a": {"type": "integer"}}})),
        GrammarError::SchemaKeyword { .. }
    ));
    assert!(matches!(
        refused(json!({"type": "string", "pattern": "("})),
        GrammarError::Regex(_)
    ));
}

/// Listed names that begin with every character a name escapes leave other names no escaped
/// first character, and still no empty one: a listed name cannot come twice.
#[test]
fn other_names_stay_other_when_listed_ones_take_every_escape() {
    let escaped = (0..0x20u8).map(char::from).chain(['"', '\\']);
    let properties: Map<String, Value> = escaped.map(|c| (c.to_string(), json!({"type": "integer"}))).collect();
    let schema = json!({"type": "object", "properties": properties, "additionalProperties": {"type": "boolean"}});
    let g = schema_grammar(&schema, None).unwrap();
    assert!(accepts(&g, r#"{"\u0000": 1, "x": true, "\u0000x": true, "": false}"#));
    assert!(!accepts(&g, r#"{"\u0000": 1, "\u0000": true}"#));
    assert!(!accepts(&g, r#"{"\"": 1, "\"": true}"#));
}

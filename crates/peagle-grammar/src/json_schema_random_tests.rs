//! The JSON schema compiler against an independent validator (the jsonschema crate, formats
//! checked), over schemas drawn at random: every text the grammar takes, walked byte by byte at
//! random, is JSON the schema accepts; and instances drawn from each schema, written as
//! serde_json writes them (members in the schema's order), compact and pretty, are taken.

use super::*;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// Member names: plain, with a space, a quote and a non-ASCII letter.
const NAMES: [&str; 6] = ["a", "b", "name", "x y", "é", "q\"d"];
/// What drawn strings are made of: letters, a digit, JSON's specials, a control character and
/// characters of two, three and four UTF-8 bytes.
const TEXT: [char; 11] = ['a', 'Z', '0', ' ', '"', '\\', '\n', '\u{1}', 'é', '日', '𝄞'];
/// Values for `enum` and `const`.
fn values() -> [Value; 8] {
    [
        json!("x"),
        json!("q\"\n"),
        json!(3),
        json!(-1.5),
        json!(true),
        json!(null),
        json!({"k": [1, "a"]}),
        json!([]),
    ]
}

/// A schema drawn at random, with subschemas `depth` levels deep at most.
fn draw_schema(r: &mut StdRng, depth: u32) -> Value {
    match r.random_range(0..if depth == 0 { 7 } else { 12 }) {
        0 => draw_string_schema(r),
        // Marks two apart at least, so that exclusive bounds leave an integer between.
        1 => draw_bounds(r, "integer", &[-20.0, -2.0, 0.0, 7.0, 1_000_000.0]),
        2 => draw_bounds(r, "number", &[-10.5, -1.0, 0.0, 0.25, 3.0, 100.125]),
        3 => json!({"type": "boolean"}),
        4 => json!({"type": "null"}),
        5 => {
            let options: Vec<Value> = (0..r.random_range(1..=3))
                .map(|_| values().choose(r).unwrap().clone())
                .collect();
            json!({"enum": options})
        }
        6 => json!({"const": values().choose(r).unwrap().clone()}),
        7 | 8 => draw_object_schema(r, depth),
        9 => {
            let mut schema = json!({"type": "array", "items": draw_schema(r, depth - 1)});
            let min = r.random_range(0..=2);
            if r.random_bool(0.5) {
                schema["minItems"] = json!(min);
            }
            if r.random_bool(0.5) {
                schema["maxItems"] = json!(min + r.random_range(0..=3));
            }
            if r.random_bool(0.3) {
                schema["prefixItems"] = json!([draw_schema(r, depth - 1), draw_schema(r, depth - 1)]);
            }
            schema
        }
        10 => json!({"anyOf": [draw_schema(r, depth - 1), draw_schema(r, depth - 1)]}),
        _ => match r.random_range(0..3) {
            0 => json!({"type": ["string", "null"]}),
            1 => json!({"type": ["integer", "boolean"]}),
            _ => json!({}),
        },
    }
}

/// A string schema with lengths, a pattern, a format or none of them.
fn draw_string_schema(r: &mut StdRng) -> Value {
    let mut schema = json!({"type": "string"});
    match r.random_range(0..4) {
        0 => {}
        1 => {
            let min = r.random_range(0..=3);
            if r.random_bool(0.7) {
                schema["minLength"] = json!(min);
            }
            if r.random_bool(0.7) {
                schema["maxLength"] = json!(min + r.random_range(0..=4));
            }
        }
        2 => schema["pattern"] = json!(*["^[a-z]+$", "^[0-9]{2,4}$", "a|bb"].choose(r).unwrap()),
        _ => {
            let formats = ["date", "time", "date-time", "uuid", "email", "ipv4"];
            schema["format"] = json!(*formats.choose(r).unwrap());
        }
    }
    schema
}

/// An integer or number schema with none, one or two bounds drawn from `marks`, either of
/// them exclusive.
fn draw_bounds(r: &mut StdRng, t: &str, marks: &[f64]) -> Value {
    let mut schema = json!({"type": t});
    let lo = r.random_range(0..marks.len() - 1);
    let hi = r.random_range(lo + 1..marks.len());
    let mark = |i: usize| match t {
        "integer" => json!(marks[i] as i64),
        _ => json!(marks[i]),
    };
    for (at, inclusive, exclusive) in [(lo, "minimum", "exclusiveMinimum"), (hi, "maximum", "exclusiveMaximum")] {
        if r.random_bool(0.6) {
            schema[if r.random_bool(0.3) { exclusive } else { inclusive }] = mark(at);
        }
    }
    schema
}

fn draw_object_schema(r: &mut StdRng, depth: u32) -> Value {
    let mut names: Vec<&str> = NAMES.to_vec();
    names.retain(|_| r.random_bool(0.5));
    let mut properties = Map::new();
    let mut required = Vec::new();
    for name in names {
        properties.insert(name.to_string(), draw_schema(r, depth - 1));
        if r.random_bool(0.5) {
            required.push(json!(name));
        }
    }
    let mut schema = json!({"type": "object", "properties": properties, "required": required});
    match r.random_range(0..4) {
        0 => {}
        1 => schema["additionalProperties"] = json!(false),
        2 => schema["additionalProperties"] = json!(true),
        _ => schema["additionalProperties"] = draw_schema(r, 0),
    }
    schema
}

/// A text the grammar takes, made byte by byte, each drawn from the bytes the state allows
/// (closing and short choices favoured half the time, so that walks end); None past `limit`
/// bytes.
fn walk(g: &Grammar, r: &mut StdRng, limit: usize) -> Option<Vec<u8>> {
    let mut state = g.start();
    let mut text = Vec::new();
    while text.len() < limit {
        if state.accepts() && (state.is_final() || r.random_bool(0.3)) {
            return Some(text);
        }
        let allowed: Vec<u8> = (0..=255u8).filter(|&b| !g.advance(&state, b).is_dead()).collect();
        assert!(!allowed.is_empty(), "a live state allows no byte after {text:?}");
        let favoured: Vec<u8> = allowed.iter().copied().filter(|b| b"\"}]0tn,".contains(b)).collect();
        let byte = match favoured.choose(r) {
            Some(&b) if r.random_bool(0.5) => b,
            _ => *allowed.choose(r).unwrap(),
        };
        state = g.advance(&state, byte);
        text.push(byte);
    }
    None
}

/// An instance of `schema` drawn at random; members in the schema's order, as the grammar
/// writes them.
fn draw_instance(schema: &Value, r: &mut StdRng) -> Value {
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        return options.choose(r).unwrap().clone();
    }
    if let Some(options) = schema.get("anyOf").and_then(Value::as_array) {
        return draw_instance(options.choose(r).unwrap(), r);
    }
    let t = match &schema["type"] {
        Value::String(t) => t.as_str(),
        Value::Array(types) => types.choose(r).unwrap().as_str().unwrap(),
        _ => return json!([1, "x", {"k": null}]),
    };
    match t {
        "string" => json!(draw_string(schema, r)),
        "integer" => {
            let (lo, hi) = bounds(schema, 1.0, -1000.0, 1000.0);
            json!(r.random_range(lo.ceil() as i64..=hi.floor() as i64))
        }
        // Eighths, which f64 holds exactly, strictly inside the bounds (both multiples of 1/8).
        "number" => {
            let (lo, hi) = bounds(schema, 0.125, -50.0, 50.0);
            json!(lo + (hi - lo) * r.random_range(0..=8) as f64 / 8.0)
        }
        "boolean" => json!(r.random_bool(0.5)),
        "null" => Value::Null,
        "object" => {
            let required: Vec<&Value> = schema["required"].as_array().unwrap().iter().collect();
            let mut out = Map::new();
            for (name, sub) in schema["properties"].as_object().unwrap() {
                if required.contains(&&json!(name)) || r.random_bool(0.5) {
                    out.insert(name.clone(), draw_instance(sub, r));
                }
            }
            match schema.get("additionalProperties") {
                Some(Value::Bool(false)) | None => {}
                Some(Value::Bool(true)) => _ = out.insert("zz".into(), json!([true])),
                Some(sub) => _ = out.insert("zz".into(), draw_instance(sub, r)),
            }
            Value::Object(out)
        }
        _ => {
            let min = schema["minItems"].as_u64().unwrap_or(0);
            let max = schema["maxItems"].as_u64().unwrap_or(min + 3);
            let prefix = schema["prefixItems"].as_array().cloned().unwrap_or_default();
            let items: Vec<Value> = (0..r.random_range(min..=max) as usize)
                .map(|i| draw_instance(prefix.get(i).unwrap_or(&schema["items"]), r))
                .collect();
            json!(items)
        }
    }
}

/// The range of numbers an integer or number schema allows, `step` inside exclusive bounds,
/// and `lo` or `hi` where there is no bound.
fn bounds(schema: &Value, step: f64, lo: f64, hi: f64) -> (f64, f64) {
    let at = |key: &str| schema.get(key).and_then(Value::as_f64);
    let lo = at("minimum").or(at("exclusiveMinimum").map(|x| x + step)).unwrap_or(lo);
    let hi = at("maximum")
        .or(at("exclusiveMaximum").map(|x| x - step))
        .unwrap_or(hi.max(lo));
    (lo, hi)
}

fn draw_string(schema: &Value, r: &mut StdRng) -> String {
    let from = |r: &mut StdRng, alphabet: &str, lengths: std::ops::RangeInclusive<usize>| -> String {
        let chars: Vec<char> = alphabet.chars().collect();
        let n = r.random_range(lengths);
        (0..n).map(|_| *chars.choose(r).unwrap()).collect()
    };
    match schema["pattern"].as_str() {
        Some("^[a-z]+$") => return from(r, "abcxyz", 1..=5),
        Some("^[0-9]{2,4}$") => return from(r, "0123456789", 2..=4),
        Some(_) => return (*["a", "bb"].choose(r).unwrap()).into(),
        None => {}
    }
    let samples: &[&str] = match schema["format"].as_str() {
        Some("date") => &["2024-02-29", "1999-12-31"],
        Some("time") => &["23:59:59Z", "08:30:00.25+02:00"],
        Some("date-time") => &["2024-01-01T00:00:00Z", "2000-06-15T12:00:00.5-07:30"],
        Some("uuid") => &["123e4567-e89b-12d3-a456-426614174000"],
        Some("email") => &["ada@example.com", "x.y+z@mail.co.uk"],
        Some("ipv4") => &["192.168.0.1", "0.0.0.0", "255.255.255.255"],
        _ => &[],
    };
    if let Some(sample) = samples.choose(r) {
        return sample.to_string();
    }
    let min = schema["minLength"].as_u64().unwrap_or(0);
    let max = schema["maxLength"].as_u64().unwrap_or(min + 5);
    let n = r.random_range(min..=max) as usize;
    (0..n).map(|_| *TEXT.choose(r).unwrap()).collect()
}

fn accepts(g: &Grammar, text: &[u8]) -> bool {
    g.advance_bytes(&g.start(), text).accepts()
}

#[test]
fn random_schemas_take_their_instances_and_only_valid_json() {
    let mut r = StdRng::seed_from_u64(20261203);
    let (mut walked, mut unfinished) = (0, 0);
    for _ in 0..150 {
        let schema = draw_schema(&mut r, 3);
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .build(&schema)
            .unwrap();
        let g = schema_grammar(&schema, None).unwrap_or_else(|e| panic!("{schema}: {e}"));
        for _ in 0..8 {
            let instance = draw_instance(&schema, &mut r);
            assert!(validator.is_valid(&instance), "drawn {instance} for {schema}");
            for text in [
                serde_json::to_string(&instance),
                serde_json::to_string_pretty(&instance),
            ] {
                let text = text.unwrap();
                assert!(accepts(&g, text.as_bytes()), "{schema} refuses {text}");
            }
        }
        for _ in 0..8 {
            let Some(text) = walk(&g, &mut r, 600) else {
                unfinished += 1;
                continue;
            };
            let value: Value = serde_json::from_slice(&text)
                .unwrap_or_else(|e| panic!("{schema} takes {:?}, not JSON: {e}", String::from_utf8_lossy(&text)));
            let errors: Vec<String> = validator.iter_errors(&value).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{schema} takes {value}: {errors:?}");
            walked += 1;
        }
    }
    assert!(walked > 4 * unfinished, "{walked} walks ended, {unfinished} did not");
}

//! The structural tag reader's tests: tags read and compiled for a small vocabulary with
//! harmony's markers, the texts they take and refuse, and what is refused with its place.

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

//! Calls a chat request forces with `tool_choice` (vLLM's way, which needs no tool call
//! parser): the answer is held to a JSON schema and read back as calls. A named function's
//! answer is its arguments, following its parameters' schema; a "required" answer is a list of
//! calls, `[{"name": ..., "parameters": {...}}, ...]`, of the offered functions (one at most
//! where `parallel_tool_calls` is false). As in vLLM and OpenAI, such an answer finishes with
//! "stop", not "tool_calls".

use crate::answer::{CallPiece, Split};
use crate::protocol::tools::{FunctionDefinition, ToolChoice};
use serde::Deserialize;
use serde_json::{json, Value};

/// The schema a forced answer follows, where `choice` forces calls of `tools`.
pub fn forced_schema(choice: &ToolChoice, tools: &[FunctionDefinition], parallel: bool) -> Option<Value> {
    let forced = choice.forced(tools);
    match choice {
        ToolChoice::Named(_) => forced.first().map(|f| f.arguments_schema()),
        ToolChoice::Required => {
            let calls: Vec<Value> = forced
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    // A tool's own references (`#/$defs/...`) point into its parameters,
                    // which sit here in the list's schema.
                    let mut parameters = f.arguments_schema();
                    rebase_references(&mut parameters, &format!("/items/anyOf/{i}/properties/parameters"));
                    json!({
                        "type": "object",
                        "properties": {"name": {"const": f.name}, "parameters": parameters},
                        "required": ["name", "parameters"],
                        "additionalProperties": false
                    })
                })
                .collect();
            let mut list = json!({"type": "array", "items": {"anyOf": calls}, "minItems": 1});
            if !parallel {
                list["maxItems"] = json!(1);
            }
            Some(list)
        }
        ToolChoice::Auto | ToolChoice::None => None,
    }
}

/// Points `schema`'s local references (`#...`) at `at` + what they named: where the schema
/// sits inside a larger one. Values (`const`, `enum`, `default`, `examples`) are left alone.
fn rebase_references(schema: &mut Value, at: &str) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match (key.as_str(), value) {
                    ("$ref", Value::String(reference)) => {
                        if let Some(rest) = reference.strip_prefix('#') {
                            *reference = format!("#{at}{rest}");
                        }
                    }
                    ("const" | "enum" | "default" | "examples", _) => {}
                    (_, value) => rebase_references(value, at),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rebase_references(v, at)),
        _ => {}
    }
}

/// Splits a forced answer into its calls.
pub enum ForcedCalls {
    /// The answer is the arguments of one call of the function; `started` once named.
    Named { name: String, started: bool },
    /// The answer is a list of calls, read whole at its end.
    Required { held: String },
}

#[derive(Deserialize)]
struct Call {
    name: String,
    parameters: Value,
}

impl ForcedCalls {
    pub fn new(choice: &ToolChoice) -> Option<Self> {
        match choice {
            ToolChoice::Named(name) => Some(Self::Named {
                name: name.clone(),
                started: false,
            }),
            ToolChoice::Required => Some(Self::Required { held: String::new() }),
            ToolChoice::Auto | ToolChoice::None => None,
        }
    }

    /// What `text` adds; `last` reads what was held back. A list that does not read as calls
    /// (cut short by max_tokens) is content.
    pub fn split(&mut self, text: &str, last: bool) -> Split {
        match self {
            Self::Named { name, started } => {
                if text.is_empty() && (*started || !last) {
                    return Split::default();
                }
                let piece = CallPiece {
                    index: 0,
                    name: (!*started).then(|| name.clone()),
                    arguments: text.to_string(),
                };
                *started = true;
                Split {
                    calls: vec![piece],
                    ..Split::default()
                }
            }
            Self::Required { held } => {
                held.push_str(text);
                if !last {
                    return Split::default();
                }
                let held = std::mem::take(held);
                match serde_json::from_str::<Vec<Call>>(&held) {
                    Ok(calls) => Split {
                        calls: calls
                            .into_iter()
                            .enumerate()
                            .map(|(index, c)| CallPiece {
                                index,
                                name: Some(c.name),
                                arguments: c.parameters.to_string(),
                            })
                            .collect(),
                        ..Split::default()
                    },
                    Err(_) => Split::content(held),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::{call, split_every_way, AnswerParser, CallParser};
    use peagle_grammar::{Spec, Vocabulary};

    fn tools() -> Vec<FunctionDefinition> {
        let tools = json!([
            {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            {"name": "now"}
        ]);
        serde_json::from_value(tools).unwrap()
    }

    fn split(choice: &ToolChoice, text: &str) -> (String, Vec<(String, String)>) {
        let make = || AnswerParser::Template {
            thinking: None,
            calls: Some(CallParser::Forced(ForcedCalls::new(choice).unwrap())),
        };
        let (reasoning, content, calls, ends_in_call) = split_every_way(make, text);
        assert!(
            reasoning.is_empty() && !ends_in_call,
            "a forced answer finishes with stop"
        );
        (content, calls)
    }

    #[test]
    fn a_named_call_is_the_whole_answer_as_its_arguments() {
        let choice = ToolChoice::Named("get_weather".into());
        let text = r#"{"city": "Paris"}"#;
        assert_eq!(split(&choice, text), (String::new(), vec![call("get_weather", text)]));
        assert_eq!(
            split(&choice, ""),
            (String::new(), vec![call("get_weather", "")]),
            "cut before its first token"
        );
    }

    #[test]
    fn a_required_answer_is_a_list_of_calls() {
        let text = r#"[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "now", "parameters": {}}]"#;
        let calls = vec![call("get_weather", r#"{"city":"Oslo"}"#), call("now", "{}")];
        assert_eq!(split(&ToolChoice::Required, text), (String::new(), calls));
        let cut = r#"[{"name": "get_weather", "param"#;
        assert_eq!(split(&ToolChoice::Required, cut), (cut.to_string(), vec![]));
    }

    /// The schemas hold the answer to offered functions and their parameters, and to one call
    /// where parallel calls are off.
    #[test]
    fn the_schemas_take_calls_of_the_offered_functions_only() {
        let accepts = |schema: Value, text: &str| {
            let grammar = Spec::JsonSchema {
                schema,
                whitespace: None,
            }
            .compile(&Vocabulary::new(Vec::new()))
            .unwrap();
            grammar.advance_bytes(&grammar.start(), text.as_bytes()).accepts()
        };
        let named = forced_schema(&ToolChoice::Named("get_weather".into()), &tools(), true).unwrap();
        assert!(accepts(named.clone(), r#"{"city": "Rome"}"#) && !accepts(named, r#"{"town": "Rome"}"#));
        let two = r#"[{"name": "now", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "x"}}]"#;
        let required = forced_schema(&ToolChoice::Required, &tools(), true).unwrap();
        assert!(accepts(required.clone(), two));
        assert!(!accepts(required.clone(), "[]"));
        assert!(!accepts(required, r#"[{"name": "later", "parameters": {}}]"#));
        let one = forced_schema(&ToolChoice::Required, &tools(), false).unwrap();
        assert!(!accepts(one.clone(), two) && accepts(one, r#"[{"name": "now", "parameters": {}}]"#));
        assert_eq!(forced_schema(&ToolChoice::Auto, &tools(), true), None);
    }

    /// A tool's references into its own parameters (pydantic's `$defs`, or `#` itself) still
    /// name them inside the list of calls.
    #[test]
    fn a_tools_references_follow_it_into_the_list() {
        let tools: Vec<FunctionDefinition> = serde_json::from_value(json!([
            {"name": "now"},
            {"name": "plan", "parameters": {
                "$defs": {"Step": {"type": "object", "properties": {"do": {"type": "string"}, "then": {"anyOf": [{"$ref": "#/$defs/Step"}, {"type": "null"}]}}, "required": ["do", "then"]}},
                "type": "object",
                "properties": {"first": {"$ref": "#/$defs/Step"}, "default": {"const": {"$ref": "#/kept"}}},
                "required": ["first"]
            }}
        ]))
        .unwrap();
        let schema = forced_schema(&ToolChoice::Required, &tools, true).unwrap();
        let grammar = Spec::JsonSchema {
            schema: schema.clone(),
            whitespace: None,
        }
        .compile(&Vocabulary::new(Vec::new()))
        .unwrap();
        let text = r#"[{"name": "plan", "parameters": {"first": {"do": "a", "then": {"do": "b", "then": null}}}}]"#;
        assert!(grammar.advance_bytes(&grammar.start(), text.as_bytes()).accepts());
        let kept = &schema["items"]["anyOf"][1]["properties"]["parameters"]["properties"]["default"]["const"]["$ref"];
        assert_eq!(kept, "#/kept", "a value is not a reference");
    }
}

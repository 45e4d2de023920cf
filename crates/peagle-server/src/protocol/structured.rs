//! Structured output as OpenAI and vLLM ask for it: `response_format` (json_object,
//! json_schema), vLLM's `structured_outputs` and its older `guided_json`, `guided_regex`,
//! `guided_choice`, `guided_grammar` (GBNF, as xgrammar reads it), with
//! `guided_whitespace_pattern`, and xgrammar's structural tags (`response_format` of type
//! `structural_tag`, `structured_outputs.structural_tag`), read when compiled against the
//! model's vocabulary (`peagle_grammar::structural_tag`). At most one may constrain a
//! request. Held as raw JSON, so that a wrong type is a 400 naming the field, not a body
//! error.

use crate::error::ApiError;
use peagle_grammar::Spec;
use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct StructuredRequest {
    /// `{"type": "text"}`, `{"type": "json_object"}`, `{"type": "json_schema",
    /// "json_schema": {"name": ..., "schema": {...}}}` or `{"type": "structural_tag", "format":
    /// {...}}` (or its older `structures` and `triggers`).
    response_format: Option<Value>,
    /// vLLM extension: one of `json` (a schema), `regex`, `choice`, `grammar`,
    /// `structural_tag` (its JSON text) or `json_object: true`, with `whitespace_pattern` or
    /// `disable_any_whitespace`.
    structured_outputs: Option<Value>,
    /// vLLM extension: a JSON schema (or its text) the answer follows.
    guided_json: Option<Value>,
    /// vLLM extension: a regex the answer matches whole.
    guided_regex: Option<Value>,
    /// vLLM extension: the answer is one of these strings.
    guided_choice: Option<Value>,
    /// vLLM extension: a GBNF grammar (`root ::= ...`) the answer follows.
    guided_grammar: Option<Value>,
    /// vLLM extension: the whitespace allowed between JSON tokens, as a regex.
    guided_whitespace_pattern: Option<Value>,
    /// vLLM extension: a name, accepted and ignored (this server has one backend).
    guided_decoding_backend: Option<Value>,
}

/// A structured output a request asks for, and the field that asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    pub spec: Spec,
    pub param: &'static str,
}

fn invalid(param: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(Some(param), format!("{param}: {why}"))
}

fn present(value: &Option<Value>) -> Option<&Value> {
    value.as_ref().filter(|v| !v.is_null())
}

impl StructuredRequest {
    /// The structured output asked for, if any (400 naming the field for one that cannot be
    /// read, or for more than one).
    pub fn asked(&self) -> Result<Option<Asked>, ApiError> {
        let whitespace = match present(&self.guided_whitespace_pattern) {
            None => None,
            Some(Value::String(p)) => Some(p.clone()),
            Some(_) => return Err(invalid("guided_whitespace_pattern", "must be a string")),
        };
        if present(&self.guided_decoding_backend).is_some_and(|b| !b.is_string()) {
            return Err(invalid("guided_decoding_backend", "must be a string"));
        }
        let mut asked = Vec::new();
        if let Some(format) = present(&self.response_format) {
            if let Some(spec) = response_format(format, whitespace.clone())? {
                asked.push(Asked {
                    spec,
                    param: "response_format",
                });
            }
        }
        let guided = [
            ("guided_json", "json", &self.guided_json),
            ("guided_regex", "regex", &self.guided_regex),
            ("guided_choice", "choice", &self.guided_choice),
            ("guided_grammar", "grammar", &self.guided_grammar),
        ];
        for (param, kind, value) in guided {
            if let Some(value) = present(value) {
                let spec = guided_spec(kind, value, param, &whitespace)?;
                asked.push(Asked { spec, param });
            }
        }
        if let Some(outputs) = present(&self.structured_outputs) {
            if let Some(spec) = structured_outputs(outputs, whitespace)? {
                asked.push(Asked {
                    spec,
                    param: "structured_outputs",
                });
            }
        }
        match asked.len() {
            0 | 1 => Ok(asked.pop()),
            _ => Err(invalid(
                asked[1].param,
                format!(
                    "only one structured output may be asked for, and {} asks too",
                    asked[0].param
                ),
            )),
        }
    }
}

fn response_format(format: &Value, whitespace: Option<String>) -> Result<Option<Spec>, ApiError> {
    const PARAM: &str = "response_format";
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Spec::JsonObject { whitespace })),
        Some("json_schema") => {
            let described = format
                .get("json_schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| invalid(PARAM, "json_schema must be an object with the schema"))?;
            // OpenAI's json_schema mode answers with an object; a schema left out asks for any.
            let schema = match described.get("schema") {
                None | Some(Value::Null) => json!({"type": "object"}),
                Some(schema) => schema_value(schema, PARAM)?,
            };
            Ok(Some(Spec::JsonSchema { schema, whitespace }))
        }
        Some("structural_tag") => Ok(Some(Spec::StructuralTag(format.clone()))),
        _ => Err(invalid(
            PARAM,
            "type must be \"text\", \"json_object\", \"json_schema\" or \"structural_tag\"",
        )),
    }
}

/// vLLM's `structured_outputs` object.
fn structured_outputs(outputs: &Value, whitespace: Option<String>) -> Result<Option<Spec>, ApiError> {
    const PARAM: &str = "structured_outputs";
    let outputs = outputs.as_object().ok_or_else(|| invalid(PARAM, "must be an object"))?;
    let field = |key: &str| outputs.get(key).filter(|v| !v.is_null() && **v != Value::Bool(false));
    let whitespace = match (field("whitespace_pattern"), field("disable_any_whitespace")) {
        (Some(Value::String(p)), _) => Some(p.clone()),
        (Some(_), _) => return Err(invalid(PARAM, "whitespace_pattern must be a string")),
        (None, Some(_)) => Some(String::new()),
        (None, None) => whitespace,
    };
    let mut specs = Vec::new();
    for kind in ["json", "regex", "choice", "grammar"] {
        if let Some(value) = field(kind) {
            specs.push(guided_spec(kind, value, PARAM, &whitespace)?);
        }
    }
    if field("json_object").is_some() {
        specs.push(Spec::JsonObject { whitespace });
    }
    if let Some(tag) = field("structural_tag") {
        let tag = match tag {
            Value::String(text) => {
                serde_json::from_str(text).map_err(|e| invalid(PARAM, format!("structural_tag is not JSON: {e}")))?
            }
            Value::Object(_) => tag.clone(),
            _ => return Err(invalid(PARAM, "structural_tag must be its JSON text")),
        };
        specs.push(Spec::StructuralTag(tag));
    }
    match specs.len() {
        0 | 1 => Ok(specs.pop()),
        _ => Err(invalid(
            PARAM,
            "give only one of json, regex, choice, grammar, structural_tag and json_object",
        )),
    }
}

/// What `value` asks for as the `kind` of guide (vLLM's names: `json`, `regex`, `choice`,
/// `grammar`), given in the field `param`; `whitespace` goes between a JSON schema's tokens.
fn guided_spec(kind: &str, value: &Value, param: &str, whitespace: &Option<String>) -> Result<Spec, ApiError> {
    let text = || {
        value
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| invalid(param, format!("{kind} must be a string")))
    };
    match kind {
        "json" => Ok(Spec::JsonSchema {
            schema: schema_value(value, param)?,
            whitespace: whitespace.clone(),
        }),
        "regex" => Ok(Spec::Regex(text()?)),
        "choice" => Ok(Spec::Choice(choice_list(value, param)?)),
        "grammar" => Ok(Spec::Grammar(text()?)),
        _ => unreachable!("no guide is called {kind}"),
    }
}

/// A schema given as JSON, or as its text.
fn schema_value(schema: &Value, param: &str) -> Result<Value, ApiError> {
    match schema {
        Value::String(text) => {
            serde_json::from_str(text).map_err(|e| invalid(param, format!("the schema is not JSON: {e}")))
        }
        Value::Object(_) | Value::Bool(_) => Ok(schema.clone()),
        _ => Err(invalid(param, "the schema must be an object")),
    }
}

fn choice_list(choices: &Value, param: &str) -> Result<Vec<String>, ApiError> {
    let strings: Option<Vec<String>> = choices
        .as_array()
        .filter(|c| !c.is_empty())
        .and_then(|c| c.iter().map(|v| v.as_str().map(str::to_string)).collect());
    strings.ok_or_else(|| invalid(param, "the choices must be a non-empty list of strings"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(body: Value) -> Result<Option<Asked>, ApiError> {
        serde_json::from_value::<StructuredRequest>(body).unwrap().asked()
    }

    #[test]
    fn each_way_of_asking_reads_as_its_spec() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let cases = [
            (
                json!({"response_format": {"type": "json_object"}}),
                Spec::JsonObject { whitespace: None },
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
                Spec::JsonSchema {
                    schema: schema.clone(),
                    whitespace: None,
                },
                "response_format",
            ),
            (
                json!({"guided_json": schema.to_string(), "guided_whitespace_pattern": " ?"}),
                Spec::JsonSchema {
                    schema: schema.clone(),
                    whitespace: Some(" ?".into()),
                },
                "guided_json",
            ),
            (json!({"guided_regex": "a+"}), Spec::Regex("a+".into()), "guided_regex"),
            (
                json!({"guided_choice": ["x", "y"]}),
                Spec::Choice(vec!["x".into(), "y".into()]),
                "guided_choice",
            ),
            (
                json!({"guided_grammar": "root ::= \"a\""}),
                Spec::Grammar("root ::= \"a\"".into()),
                "guided_grammar",
            ),
            (
                json!({"structured_outputs": {"grammar": "root ::= [0-9]+"}}),
                Spec::Grammar("root ::= [0-9]+".into()),
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"json": schema, "disable_any_whitespace": true}}),
                Spec::JsonSchema {
                    schema: schema.clone(),
                    whitespace: Some(String::new()),
                },
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"json_object": true}}),
                Spec::JsonObject { whitespace: None },
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "text"}}),
                Spec::Choice(vec!["a".into()]),
                "structured_outputs",
            ),
            (
                json!({"response_format": {"type": "structural_tag", "format": {"type": "any_text"}}}),
                Spec::StructuralTag(json!({"type": "structural_tag", "format": {"type": "any_text"}})),
                "response_format",
            ),
            (
                json!({"structured_outputs": {"structural_tag": "{\"format\": {\"type\": \"any_text\"}}"}}),
                Spec::StructuralTag(json!({"format": {"type": "any_text"}})),
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"structural_tag": {"structures": []}}}),
                Spec::StructuralTag(json!({"structures": []})),
                "structured_outputs",
            ),
        ];
        for (body, spec, param) in cases {
            assert_eq!(asked(body.clone()).unwrap(), Some(Asked { spec, param }), "{body}");
        }
        for nothing in [
            json!({}),
            json!({"response_format": {"type": "text"}, "guided_json": null, "guided_decoding_backend": "xgrammar"}),
        ] {
            assert_eq!(asked(nothing).unwrap(), None);
        }
    }

    #[test]
    fn what_cannot_be_read_is_a_400_naming_its_field() {
        let cases = [
            (json!({"response_format": {"type": "yaml"}}), "response_format"),
            (json!({"response_format": {"type": "json_schema"}}), "response_format"),
            (json!({"guided_json": "{not json"}), "guided_json"),
            (json!({"guided_json": 3}), "guided_json"),
            (json!({"guided_regex": ["a"]}), "guided_regex"),
            (json!({"guided_choice": []}), "guided_choice"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice"),
            (json!({"guided_grammar": ["root ::= \"a\""]}), "guided_grammar"),
            (
                json!({"guided_whitespace_pattern": 1, "guided_regex": "a"}),
                "guided_whitespace_pattern",
            ),
            (
                json!({"guided_decoding_backend": 1, "guided_regex": "a"}),
                "guided_decoding_backend",
            ),
            (
                json!({"structured_outputs": {"structural_tag": "{not json"}}),
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"structural_tag": 3}}),
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"structural_tag": "{}", "regex": "a"}}),
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}),
                "structured_outputs",
            ),
            (json!({"structured_outputs": "a+"}), "structured_outputs"),
            (json!({"guided_regex": "a", "guided_choice": ["a"]}), "guided_choice"),
            (
                json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}),
                "guided_regex",
            ),
        ];
        for (body, param) in cases {
            let e = asked(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
    }
}

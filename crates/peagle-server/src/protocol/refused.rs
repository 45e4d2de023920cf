//! Fields of OpenAI's and vLLM's APIs that peagle does not implement: structured output, the
//! legacy `functions` (chat's `tools` replace them), a forced tool call and beam search. Each
//! is refused with a 400
//! naming it, since ignoring it would hand the client text that does not honour what it asked
//! for. Held as raw JSON, so no value is a type error.

use super::tools::offers_tools;
use crate::error::ApiError;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

/// Each is refused unless null (or, for `response_format`, `{"type": "text"}`; for
/// `functions`, empty; for `tool_choice`, "auto" or "none"; for `use_beam_search`, false).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct Refused {
    response_format: Option<Value>,
    structured_outputs: Option<Value>,
    guided_json: Option<Value>,
    guided_regex: Option<Value>,
    guided_choice: Option<Value>,
    guided_grammar: Option<Value>,
    functions: Option<Value>,
    tool_choice: Option<Value>,
    use_beam_search: Option<Value>,
}

impl Refused {
    pub fn check(&self) -> Result<(), ApiError> {
        if self
            .response_format
            .as_ref()
            .is_some_and(|f| !is_null_or(f, |f| f["type"] == "text"))
        {
            return Err(refuse("response_format", "only {\"type\": \"text\"} is supported"));
        }
        let constraints = [
            ("structured_outputs", &self.structured_outputs),
            ("guided_json", &self.guided_json),
            ("guided_regex", &self.guided_regex),
            ("guided_choice", &self.guided_choice),
            ("guided_grammar", &self.guided_grammar),
        ];
        if let Some((name, _)) = constraints.iter().find(|(_, v)| !is_none(v)) {
            return Err(refuse(name, "structured output is not supported"));
        }
        if asks_for(&self.functions) {
            return Err(refuse(
                "functions",
                "the legacy functions are not supported (chat's tools are)",
            ));
        }
        offers_tools(self.tool_choice.as_ref())?;
        if let Some(beam) = self.use_beam_search.as_ref() {
            if !is_null_or(beam, |b| *b == false) {
                return Err(refuse("use_beam_search", "beam search is not supported"));
            }
        }
        Ok(())
    }
}

/// Whether a list field asks for something: neither null nor empty.
pub fn asks_for(value: &Option<Value>) -> bool {
    let empty = |v: &Value| v.as_array().is_some_and(Vec::is_empty);
    value.as_ref().is_some_and(|v| !is_null_or(v, empty))
}

fn is_none(value: &Option<Value>) -> bool {
    value.as_ref().is_none_or(Value::is_null)
}

fn is_null_or(value: &Value, accepted: impl Fn(&Value) -> bool) -> bool {
    value.is_null() || accepted(value)
}

fn refuse(param: &str, why: &str) -> ApiError {
    ApiError::invalid(Some(param), format!("{param}: {why} by this server"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(body: Value) -> Option<String> {
        serde_json::from_value::<Refused>(body)
            .unwrap()
            .check()
            .err()
            .and_then(|e| e.param)
    }

    #[test]
    fn accepts_what_asks_for_nothing_and_refuses_the_rest() {
        for fine in [
            json!({}),
            json!({"response_format": {"type": "text"}}),
            json!({"response_format": null, "guided_json": null}),
            json!({"functions": []}),
            json!({"functions": null, "use_beam_search": false}),
            json!({"tool_choice": "auto"}),
            json!({"tool_choice": "none"}),
        ] {
            assert_eq!(param(fine.clone()), None, "{fine}");
        }
        let refused = [
            ("response_format", json!({"response_format": {"type": "json_object"}})),
            ("guided_choice", json!({"guided_choice": ["a", "b"]})),
            ("structured_outputs", json!({"structured_outputs": {"regex": "a+"}})),
            ("functions", json!({"functions": [{"name": "f"}]})),
            ("tool_choice", json!({"tool_choice": "required"})),
            (
                "tool_choice",
                json!({"tool_choice": {"type": "function", "function": {"name": "f"}}}),
            ),
            ("use_beam_search", json!({"use_beam_search": true})),
        ];
        for (name, body) in refused {
            assert_eq!(param(body).as_deref(), Some(name));
        }
    }
}

//! Fields of OpenAI's and vLLM's APIs that peagle does not implement: the legacy `functions`
//! (chat's `tools` replace them) and beam search. Each is refused with a
//! 400 naming it, since ignoring it would hand the client text that does not honour what it asked
//! for. Held as raw JSON, so no value is a type error.

use crate::error::ApiError;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

/// Each is refused unless null (or, for `functions`, empty; for `use_beam_search`, false).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct Refused {
    functions: Option<Value>,
    use_beam_search: Option<Value>,
}

impl Refused {
    pub fn check(&self) -> Result<(), ApiError> {
        if asks_for(&self.functions) {
            return Err(refuse(
                "functions",
                "the legacy functions are not supported (chat's tools are)",
            ));
        }
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
            json!({"functions": []}),
            json!({"functions": null, "use_beam_search": false}),
        ] {
            assert_eq!(param(fine.clone()), None, "{fine}");
        }
        let refused = [
            ("functions", json!({"functions": [{"name": "f"}]})),
            ("use_beam_search", json!({"use_beam_search": true})),
        ];
        for (name, body) in refused {
            assert_eq!(param(body).as_deref(), Some(name));
        }
    }
}

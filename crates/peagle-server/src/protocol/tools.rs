//! Function tools in chat: the `tools` and `tool_choice` a request offers, the calls in past
//! assistant turns and in answers, and a call's pieces in stream chunks, as OpenAI has them.
//! `parallel_tool_calls: false` keeps an answer to its first call (the answer's parser).

use crate::error::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct Tool {
    /// "function" (the default), the only kind.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionDefinition,
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct FunctionDefinition {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema object; its properties are shown to the model in the order given.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// Accepted for clients that always send it; the arguments are not held to the schema.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl FunctionDefinition {
    /// The schema its arguments follow where a call of it is forced: its parameters, or any
    /// object where it has none.
    pub fn arguments_schema(&self) -> Value {
        self.parameters
            .clone()
            .unwrap_or_else(|| serde_json::json!({"type": "object"}))
    }
}

/// A tool call, in a past assistant turn or in an answer.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct ToolCall {
    pub id: String,
    /// "function".
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as the model wrote them: JSON text, not checked against the schema.
    pub arguments: String,
}

fn function_kind() -> String {
    "function".into()
}

impl ToolCall {
    /// A call of `name` with a new id.
    pub fn new(name: String, arguments: String) -> Self {
        Self {
            id: call_id(),
            kind: function_kind(),
            function: FunctionCall { name, arguments },
        }
    }

    /// Refuses call `j` of message `i` unless it calls a function by a valid name: the name
    /// goes into a harmony message header.
    pub fn check(&self, i: usize, j: usize) -> Result<(), ApiError> {
        let field = |name: &str| format!("messages[{i}].tool_calls[{j}].{name}");
        check_kind(&self.kind, &field("type"))?;
        check_name(&self.function.name, &field("function.name"))
    }

    /// Call `j` of message `i`'s arguments as the JSON value a chat template reads (an empty
    /// object for none, as vLLM gives it).
    pub fn arguments_json(&self, i: usize, j: usize) -> Result<Value, ApiError> {
        if self.function.arguments.trim().is_empty() {
            return Ok(Value::Object(Default::default()));
        }
        serde_json::from_str(&self.function.arguments).map_err(|e| {
            let field = format!("messages[{i}].tool_calls[{j}].function.arguments");
            ApiError::invalid(Some(&field), format!("{field}: not JSON: {e}"))
        })
    }
}

/// A call's piece in a stream chunk: the first holds its id, type and name, each later one
/// more of its arguments.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeltaToolCall {
    /// The call's place among the choice's calls.
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: DeltaFunctionCall,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeltaFunctionCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

impl DeltaToolCall {
    /// Call `index` begins: a new id, its name and its first arguments.
    pub fn start(index: usize, name: String, arguments: String) -> Self {
        Self {
            index,
            id: Some(call_id()),
            kind: Some("function"),
            function: DeltaFunctionCall {
                name: Some(name),
                arguments,
            },
        }
    }

    /// More of call `index`'s arguments.
    pub fn more(index: usize, arguments: String) -> Self {
        Self {
            index,
            id: None,
            kind: None,
            function: DeltaFunctionCall { name: None, arguments },
        }
    }
}

/// A new tool call id, as OpenAI spells them.
fn call_id() -> String {
    format!("call_{}", super::random_id())
}

/// What `tool_choice` asks of the answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model may call the tools or answer (the default).
    Auto,
    /// No tools are offered.
    None,
    /// The answer is one or more calls (`"required"`).
    Required,
    /// The answer is one call of this function (`{"type": "function", "function": {"name"}}`).
    Named(String),
}

impl ToolChoice {
    /// Reads `tool_choice` (400 for anything else).
    pub fn of(tool_choice: Option<&Value>) -> Result<Self, ApiError> {
        let named = |v: &Value| match (v["type"].as_str(), v["function"]["name"].as_str()) {
            (Some("function") | None, Some(name)) => Some(name.to_string()),
            _ => None,
        };
        match tool_choice {
            None | Some(Value::Null) => Ok(Self::Auto),
            Some(Value::String(choice)) if choice == "auto" => Ok(Self::Auto),
            Some(Value::String(choice)) if choice == "none" => Ok(Self::None),
            Some(Value::String(choice)) if choice == "required" => Ok(Self::Required),
            Some(v) => named(v).map(Self::Named).ok_or_else(|| {
                ApiError::invalid(
                    Some("tool_choice"),
                    "tool_choice: expected \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                )
            }),
        }
    }

    /// Whether the answer must be calls.
    pub fn forces(&self) -> bool {
        matches!(self, Self::Required | Self::Named(_))
    }

    /// The functions of `tools` one of which the answer must call: all of them for
    /// "required", the named one, or none where no call is forced.
    pub fn forced<'a>(&self, tools: &'a [FunctionDefinition]) -> Vec<&'a FunctionDefinition> {
        match self {
            Self::Required => tools.iter().collect(),
            Self::Named(name) => tools.iter().filter(|f| f.name == *name).collect(),
            Self::Auto | Self::None => Vec::new(),
        }
    }
}

/// The function tools a chat request offers the model: its `tools`, unless `tool_choice` is
/// "none" (as vLLM's `--exclude-tools-when-tool-choice-none` has it). Only function tools, with
/// OpenAI's names (`valid_name`), each once, and a JSON Schema object as parameters; a forced
/// call names an offered function, or needs one offered.
pub fn offered_tools(tools: Option<&[Tool]>, tool_choice: &ToolChoice) -> Result<Vec<FunctionDefinition>, ApiError> {
    let mut functions: Vec<FunctionDefinition> = Vec::new();
    for (i, tool) in tools.unwrap_or_default().iter().enumerate() {
        let field = |name: &str| format!("tools[{i}].{name}");
        check_kind(&tool.kind, &field("type"))?;
        check_function(&tool.function, &functions, |name| field(&format!("function.{name}")))?;
        functions.push(tool.function.clone());
    }
    let refuse = |why: String| Err(ApiError::invalid(Some("tool_choice"), format!("tool_choice: {why}")));
    match tool_choice {
        ToolChoice::None => return Ok(Vec::new()),
        ToolChoice::Required if functions.is_empty() => return refuse("\"required\" needs tools to call".into()),
        ToolChoice::Named(name) if !functions.iter().any(|f| f.name == *name) => {
            return refuse(format!("no tool is named {name:?}"))
        }
        _ => {}
    }
    Ok(functions)
}

/// Refuses an offered `function` unless it has a valid name (`check_name`), one none of the
/// functions offered `before` has, and a JSON Schema object as parameters; `field` names
/// its fields (`tools[i].function.name` in chat, `tools[i].name` in the Responses API).
pub fn check_function(
    function: &FunctionDefinition,
    before: &[FunctionDefinition],
    field: impl Fn(&str) -> String,
) -> Result<(), ApiError> {
    let name = &function.name;
    check_name(name, &field("name"))?;
    if before.iter().any(|f| f.name == *name) {
        return Err(ApiError::invalid(
            Some(&field("name")),
            format!("{}: a second tool named {name:?}", field("name")),
        ));
    }
    if function.parameters.as_ref().is_some_and(|p| !p.is_object()) {
        return Err(ApiError::invalid(
            Some(&field("parameters")),
            format!("{}: a JSON Schema object is expected", field("parameters")),
        ));
    }
    Ok(())
}

pub fn check_kind(kind: &str, field: &str) -> Result<(), ApiError> {
    match kind {
        "function" => Ok(()),
        other => Err(ApiError::invalid(
            Some(field),
            format!("{field}: only function tools are supported, not {other:?}"),
        )),
    }
}

/// OpenAI's rule for a function's name: 1 to 64 letters, digits, underscores or dashes. The
/// model names its call in a message header, where other characters would end the name.
pub fn check_name(name: &str, field: &str) -> Result<(), ApiError> {
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
        return Err(ApiError::invalid(
            Some(field),
            format!("{field}: {name:?} is not 1 to 64 letters, digits, underscores or dashes"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn offered(tools: Value, choice: Value) -> Result<Vec<String>, Option<String>> {
        let tools: Vec<Tool> = serde_json::from_value(tools).unwrap();
        let choice = ToolChoice::of(Some(&choice)).map_err(|e| e.param)?;
        offered_tools(Some(&tools), &choice)
            .map(|f| f.into_iter().map(|f| f.name).collect())
            .map_err(|e| e.param)
    }

    fn tool(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}})
    }

    #[test]
    fn auto_offers_the_tools_and_none_offers_none() {
        let tools = json!([tool("get_weather"), tool("find-2")]);
        let both = Ok(vec!["get_weather".to_string(), "find-2".to_string()]);
        assert_eq!(offered(tools.clone(), Value::Null), both);
        assert_eq!(offered(tools.clone(), json!("auto")), both);
        assert_eq!(offered(tools.clone(), json!("none")), Ok(vec![]));
        assert_eq!(offered(tools.clone(), json!("required")), both);
        let named = json!({"type": "function", "function": {"name": "find-2"}});
        assert_eq!(
            offered(tools.clone(), named),
            both,
            "a forced call still sees every tool"
        );
        assert_eq!(offered_tools(None, &ToolChoice::Auto).unwrap().len(), 0);
        let untyped = json!([{"function": {"name": "f"}}]);
        assert_eq!(offered(untyped, Value::Null), Ok(vec!["f".to_string()]));
    }

    #[test]
    fn past_calls_name_a_function_validly() {
        let call = |kind: &str, name: &str| -> ToolCall {
            serde_json::from_value(json!({"id": "c", "type": kind, "function": {"name": name, "arguments": "{}"}}))
                .unwrap()
        };
        assert!(call("function", "get_weather").check(1, 0).is_ok());
        let param = |c: ToolCall| c.check(1, 2).unwrap_err().param;
        assert_eq!(
            param(call("function", "a<|end|>")).as_deref(),
            Some("messages[1].tool_calls[2].function.name")
        );
        assert_eq!(
            param(call("web", "f")).as_deref(),
            Some("messages[1].tool_calls[2].type")
        );
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_its_field() {
        let named = json!({"type": "function", "function": {"name": "g"}});
        for (tools, choice, field) in [
            (json!([]), json!("required"), "tool_choice"),
            (json!([tool("f")]), named, "tool_choice"),
            (json!([tool("f")]), json!("always"), "tool_choice"),
            (json!([tool("f")]), json!({"type": "function"}), "tool_choice"),
            (
                json!([{"type": "code_interpreter", "function": {"name": "f"}}]),
                Value::Null,
                "tools[0].type",
            ),
            (json!([tool("f"), tool("a b")]), Value::Null, "tools[1].function.name"),
            (json!([tool(&"x".repeat(65))]), Value::Null, "tools[0].function.name"),
            (json!([tool("")]), Value::Null, "tools[0].function.name"),
            (json!([tool("f"), tool("f")]), Value::Null, "tools[1].function.name"),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
                Value::Null,
                "tools[0].function.parameters",
            ),
        ] {
            assert_eq!(offered(tools, choice), Err(Some(field.to_string())), "{field}");
        }
    }

    #[test]
    fn calls_serialize_as_openai_has_them() {
        let call = ToolCall::new("get_weather".into(), "{\"city\":\"Paris\"}".into());
        let json = serde_json::to_value(&call).unwrap();
        assert!(call.id.starts_with("call_") && call.id.len() == 37, "{}", call.id);
        assert_eq!(json["type"], "function");
        assert_eq!(
            json["function"],
            json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
        );
        let start = serde_json::to_value(DeltaToolCall::start(0, "f".into(), String::new())).unwrap();
        assert_eq!(start["function"], json!({"name": "f", "arguments": ""}));
        let more = serde_json::to_value(DeltaToolCall::more(0, "{}".into())).unwrap();
        assert_eq!(more, json!({"index": 0, "function": {"arguments": "{}"}}));
    }
}

//! A function tool's JSON Schema parameters as the TypeScript-like type that harmony shows
//! gpt-oss in its developer message: `type NAME = (_: TYPE) => any;`. The rules, quirks
//! included, are those of OpenAI's openai-harmony renderer, whose prompts the model was
//! trained on; the tests hold them to prompts that package rendered
//! (tests/fixtures/harmony/renders.json). Properties come in the order the request wrote them.
//!
//! - An object is `{`, a line a property (`name?:` where it is not required), then `}`.
//!   Above a property go its title (and an empty comment line), its description and its
//!   examples; after it, its default. A nested object's lines, its closing brace among them,
//!   indent by four more spaces; its opening brace follows its property's name, or opens a
//!   line of its own after the object's description, as harmony writes them.
//! - A string with an enum is the union of its quoted values; integer and number are
//!   `number`; an array is its items' type with `[]`, or `Array<any>` without items; a list
//!   of types is their union; `nullable: true` adds `| null`; anything else (`anyOf`,
//!   `const`, an unknown or missing type) is `any`.
//! - `oneOf`, of a property or of the whole schema, is a union written a variant a line, each
//!   followed by its own description and default.

use serde_json::Value;

/// The TypeScript-like type of `schema`, its nested lines indented by `indent`.
pub fn typescript(schema: &Value, indent: &str) -> String {
    if let Some(variants) = schema.get("oneOf").and_then(Value::as_array) {
        return variants
            .iter()
            .map(|v| {
                let mut comments: Vec<String> = text(v, "description").map(str::to_string).into_iter().collect();
                comments.extend(
                    v.get("default")
                        .map(|d| default_comment(d, has_enum(v), DefaultStyle::Json)),
                );
                format!("\n{indent} | {}{}", variant_type(v, indent), trailing(&comments))
            })
            .collect();
    }
    if let Some(types) = schema.get("type").and_then(Value::as_array) {
        let names: Vec<&str> = types
            .iter()
            .filter_map(Value::as_str)
            .map(|t| if t == "integer" { "number" } else { t })
            .collect();
        if !names.is_empty() {
            return names.join(" | ");
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => object(schema, indent),
        Some("string") => enum_union(schema).unwrap_or_else(|| "string".into()),
        Some("number" | "integer") => "number".into(),
        Some("boolean") => "boolean".into(),
        Some("array") => match schema.get("items") {
            Some(items) => format!("{}[]", typescript(items, indent)),
            None => "Array<any>".into(),
        },
        _ => "any".into(),
    }
}

fn object(schema: &Value, indent: &str) -> String {
    let mut out = String::new();
    if let Some(description) = text(schema, "description") {
        out += &format!("{indent}// {description}\n");
    }
    out += "{\n";
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (name, property) in properties {
            let optional = if required.contains(&name.as_str()) { "" } else { "?" };
            out += &self::property(&format!("{name}{optional}"), property, indent);
        }
    }
    out += &format!("{indent}}}");
    out
}

/// A property's lines: `label` is its name with `?` where optional.
fn property(label: &str, property: &Value, indent: &str) -> String {
    let mut out = String::new();
    if let Some(title) = text(property, "title") {
        out += &format!("{indent}// {title}\n{indent}//\n");
    }
    let one_of = property.get("oneOf");
    if let (None, Some(description)) = (one_of, text(property, "description")) {
        out += &format!("{indent}// {description}\n");
    }
    let examples = property.get("examples").and_then(Value::as_array);
    if let Some(examples) = examples.filter(|e| !e.is_empty()) {
        out += &format!("{indent}// Examples:\n");
        for example in examples.iter().filter_map(Value::as_str) {
            out += &format!("{indent}// - \"{example}\"\n");
        }
    }
    if let Some(variants) = one_of.and_then(Value::as_array) {
        return out + &property_union(label, property, variants, indent);
    }
    out += &format!(
        "{indent}{label}: {},",
        nullable(typescript(property, &format!("{indent}    ")), property)
    );
    if let (None, Some(default)) = (one_of, property.get("default")) {
        out += &format!(
            " // default: {}",
            default_value(default, has_enum(property), DefaultStyle::Bare)
        );
    }
    out + "\n"
}

/// A property's `oneOf`: its description above it, unless its first variant has the same,
/// and its default; then a variant a line, each with a description of its own (none for the
/// first where the property's went above) and its default.
fn property_union(label: &str, property: &Value, variants: &[Value], indent: &str) -> String {
    let mut out = String::new();
    let description = text(property, "description");
    let above = description.filter(|d| variants.first().and_then(|v| text(v, "description")) != Some(*d));
    if let Some(above) = above {
        out += &format!("{indent}// {above}\n");
    }
    if let Some(default) = property.get("default") {
        let default = default_value(default, has_enum(property), DefaultStyle::Bare);
        out += &format!("{indent}// default: {default}\n");
    }
    out += &format!("{indent}{label}:\n");
    for (i, variant) in variants.iter().enumerate() {
        let mut comments = Vec::new();
        if i > 0 || above.is_none() {
            let own = text(variant, "description").filter(|d| Some(*d) != description);
            comments.extend(own.map(str::to_string));
        }
        comments.extend(
            variant
                .get("default")
                .map(|d| default_comment(d, has_enum(variant), DefaultStyle::Bare)),
        );
        out += &format!("{indent} | {}{}\n", variant_type(variant, indent), trailing(&comments));
    }
    out + &format!("{indent},\n")
}

/// A `oneOf` variant's type, nested three spaces in.
fn variant_type(variant: &Value, indent: &str) -> String {
    nullable(typescript(variant, &format!("{indent}   ")), variant)
}

/// `ts` with `| null` where the schema is `nullable` and `ts` does not already allow null.
fn nullable(ts: String, schema: &Value) -> String {
    match schema.get("nullable").and_then(Value::as_bool) == Some(true) && !ts.contains("null") {
        true => ts + " | null",
        false => ts,
    }
}

/// How a default that is a string of an enum is written.
#[derive(Clone, Copy)]
enum DefaultStyle {
    /// Bare, as properties have it.
    Bare,
    /// As JSON, in quotes: a whole schema's `oneOf` variants.
    Json,
}

/// `default: ` and the default, as a comment of a `oneOf` variant.
fn default_comment(default: &Value, has_enum: bool, style: DefaultStyle) -> String {
    format!("default: {}", default_value(default, has_enum, style))
}

/// A default as harmony writes it after `default: `: a string in quotes (not escaped), a
/// string of an enum as `style` says, anything else as compact JSON.
fn default_value(default: &Value, has_enum: bool, style: DefaultStyle) -> String {
    match (default.as_str(), has_enum, style) {
        (Some(s), false, _) => format!("\"{s}\""),
        (Some(s), true, DefaultStyle::Bare) => s.to_string(),
        _ => default.to_string(),
    }
}

/// ` // ` and the comments joined by spaces, or nothing.
fn trailing(comments: &[String]) -> String {
    match comments.is_empty() {
        true => String::new(),
        false => format!(" // {}", comments.join(" ")),
    }
}

/// The union of a string enum's values, quoted; None without string values.
fn enum_union(schema: &Value) -> Option<String> {
    let values: Vec<String> = schema
        .get("enum")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .map(|v| format!("\"{v}\""))
        .collect();
    (!values.is_empty()).then(|| values.join(" | "))
}

fn has_enum(schema: &Value) -> bool {
    schema
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|values| !values.is_empty())
}

fn text<'a>(schema: &'a Value, field: &str) -> Option<&'a str> {
    schema.get(field).and_then(Value::as_str)
}

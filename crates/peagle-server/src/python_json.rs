//! The `tojson` filter as transformers gives it to chat templates: Python's `json.dumps` with
//! `ensure_ascii=False`. Items are separated by `", "` and keys by `": "` (with `indent`, a
//! line an item), keys keep their order unless `sort_keys`, and nothing is HTML-escaped.
//! minijinja's own filter writes compact JSON with `<`, `>`, `&` and `'` escaped, which
//! would show a model its tools (`tools | tojson`) otherwise than it was trained on.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde_json::ser::{Formatter, PrettyFormatter};
use std::io;

/// `value | tojson`, `tojson(indent=N)` or `tojson(sort_keys=true)`.
pub fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let cannot =
        |e: serde_json::Error| Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(e);
    let mut json = serde_json::to_value(value).map_err(cannot)?;
    if sort_keys {
        sort(&mut json);
    }
    let mut out = Vec::new();
    match indent {
        Some(n) => {
            let spaces = " ".repeat(n);
            let mut writer =
                serde_json::Serializer::with_formatter(&mut out, PrettyFormatter::with_indent(spaces.as_bytes()));
            serde::Serialize::serialize(&json, &mut writer).map_err(cannot)?;
        }
        None => {
            let mut writer = serde_json::Serializer::with_formatter(&mut out, Spaced);
            serde::Serialize::serialize(&json, &mut writer).map_err(cannot)?;
        }
    }
    let text = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(text))
}

/// Keys sorted at every level, as `sort_keys` sorts them.
fn sort(json: &mut serde_json::Value) {
    match json {
        serde_json::Value::Object(map) => {
            map.sort_keys();
            map.values_mut().for_each(sort);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(sort),
        _ => {}
    }
}

/// Python's default separators on one line: `", "` and `": "`.
struct Spaced;

impl Formatter for Spaced {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first {
            return Ok(());
        }
        writer.write_all(b", ")
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first {
            return Ok(());
        }
        writer.write_all(b", ")
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use crate::chat_template::{ChatTemplate, JsonMap};
    use serde_json::json;

    /// What Python's `json.dumps(v, ensure_ascii=False, ...)` prints for the same value.
    #[test]
    fn tojson_writes_what_python_writes() {
        let value = json!({"b": 1, "a": [true, null, 1.5, "x<y> & 'q' é\n"], "c": {"z": {}, "y": []}});
        let render = |source: &str| {
            let template = ChatTemplate::new(source, String::new(), String::new()).unwrap();
            let mut extra = JsonMap::new();
            extra.insert("v".into(), value.clone());
            template.render(&[], false, &extra).unwrap()
        };
        assert_eq!(
            render("{{ v | tojson }}"),
            r#"{"b": 1, "a": [true, null, 1.5, "x<y> & 'q' é\n"], "c": {"z": {}, "y": []}}"#
        );
        assert_eq!(
            render("{{ v | tojson(sort_keys=true) }}"),
            r#"{"a": [true, null, 1.5, "x<y> & 'q' é\n"], "b": 1, "c": {"y": [], "z": {}}}"#
        );
        let indented = "{\n  \"b\": 1,\n  \"a\": [\n    true,\n    null,\n    1.5,\n    \"x<y> & 'q' é\\n\"\n  ],\n  \
                        \"c\": {\n    \"z\": {},\n    \"y\": []\n  }\n}";
        assert_eq!(render("{{ v | tojson(indent=2) }}"), indented);
        assert_eq!(render("{{ v | tojson(2) }}"), indented);
    }
}

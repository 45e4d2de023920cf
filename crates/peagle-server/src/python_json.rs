//! The `tojson` filter as transformers gives it to chat templates: Python's `json.dumps`,
//! `ensure_ascii=False` unless told. Items are separated by `", "` and keys by `": "` (with
//! `indent`, `","` and a line an item; `separators` chooses), keys keep their order unless
//! `sort_keys`, floats are written as Python's `repr` writes them, and nothing is
//! HTML-escaped. minijinja's own filter writes compact JSON with `<`, `>`, `&` and `'`
//! escaped, which would show a model its tools (`tools | tojson`) otherwise than it was
//! trained on.

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde_json::ser::Formatter;
use std::io::{self, Write};

/// `value | tojson`, with `indent` (positional or named), `separators`, `sort_keys` and
/// `ensure_ascii` as `json.dumps` takes them.
pub fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(indent) => Some(indent),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    let separators = match kwargs.get::<Option<Vec<String>>>("separators")? {
        None => None,
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => Some((item, key)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators is (item, key)",
                ))
            }
        },
    };
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let cannot =
        |e: serde_json::Error| Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(e);
    let mut json = serde_json::to_value(value).map_err(cannot)?;
    if sort_keys {
        sort(&mut json);
    }
    // Python's defaults: ", " between items, but "," where lines follow.
    let (item, key) = separators.unwrap_or_else(|| (if indent.is_some() { "," } else { ", " }.into(), ": ".into()));
    let formatter = Python {
        item,
        key,
        indent: indent.map(|n| " ".repeat(n)),
        depth: 0,
        empty: false,
    };
    let mut out = Vec::new();
    let mut writer = serde_json::Serializer::with_formatter(&mut out, formatter);
    serde::Serialize::serialize(&json, &mut writer).map_err(cannot)?;
    let text = String::from_utf8(out).expect("serde_json writes UTF-8");
    Ok(Value::from_safe_string(if ensure_ascii { ascii(&text) } else { text }))
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

/// JSON text with DEL and every character past ASCII escaped as `\uXXXX` (UTF-16, lower
/// case), as `ensure_ascii` writes them: such characters occur only inside strings.
fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c < '\x7f' {
            out.push(c);
            continue;
        }
        let mut units = [0u16; 2];
        for unit in c.encode_utf16(&mut units) {
            out += &format!("\\u{unit:04x}");
        }
    }
    out
}

/// `json.dumps`'s layout: its separators, and with `indent`, a line an item.
struct Python {
    item: String,
    key: String,
    indent: Option<String>,
    depth: usize,
    /// Whether the container just opened has had nothing in it.
    empty: bool,
}

impl Python {
    /// Before an item or key: the item separator after the first, then its line.
    fn item<W: ?Sized + Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if !first {
            writer.write_all(self.item.as_bytes())?;
        }
        self.empty = false;
        self.line(writer, self.depth)
    }

    fn line<W: ?Sized + Write>(&self, writer: &mut W, depth: usize) -> io::Result<()> {
        if let Some(indent) = &self.indent {
            writer.write_all(b"\n")?;
            (0..depth).try_for_each(|_| writer.write_all(indent.as_bytes()))?;
        }
        Ok(())
    }

    fn open<W: ?Sized + Write>(&mut self, writer: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth += 1;
        self.empty = true;
        writer.write_all(bracket)
    }

    fn close<W: ?Sized + Write>(&mut self, writer: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth -= 1;
        if !self.empty {
            self.line(writer, self.depth)?;
        }
        self.empty = false;
        writer.write_all(bracket)
    }
}

impl Formatter for Python {
    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open(writer, b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.close(writer, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        self.item(writer, first)
    }

    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.open(writer, b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.close(writer, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        self.item(writer, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(self.key.as_bytes())
    }

    fn write_f64<W: ?Sized + Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        writer.write_all(python_float(value).as_bytes())
    }
}

/// A finite float as Python's `repr` writes it: the shortest digits that read back the same,
/// in positional notation for decimal exponents -4 to 15 (with `.0` for a whole number) and
/// otherwise as `De±XX`, the exponent at least two digits.
fn python_float(value: f64) -> String {
    // Rust's `{:e}` gives the same shortest digits: `D.DDDeX`.
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("{:e} writes an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} writes an integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    if !(-4..16).contains(&exponent) {
        let sign_of_exponent = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{mantissa}e{sign_of_exponent}{:02}", exponent.abs());
    }
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let point = exponent + 1;
    let text = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else if digits.len() <= point as usize {
        format!("{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        let (whole, fraction) = digits.split_at(point as usize);
        format!("{whole}.{fraction}")
    };
    format!("{sign}{text}")
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

    /// Each value below beside what `json.dumps` prints for it with the same arguments.
    #[test]
    fn tojson_takes_json_dumps_arguments_and_writes_floats_as_python() {
        let render = |value: serde_json::Value, call: &str| {
            let template = ChatTemplate::new(&format!("{{{{ v | {call} }}}}"), String::new(), String::new()).unwrap();
            let mut extra = JsonMap::new();
            extra.insert("v".into(), value);
            template.render(&[], false, &extra).unwrap()
        };
        let floats = json!([1e-05, 1e-06, 1e16, 1.5e300, 0.0001, 123.0, -0.0, 1e15, 12345.678, 1e22, 5e-324]);
        assert_eq!(
            render(floats, "tojson"),
            "[1e-05, 1e-06, 1e+16, 1.5e+300, 0.0001, 123.0, -0.0, 1000000000000000.0, 12345.678, 1e+22, 5e-324]"
        );
        let nested = json!({"a": [1, {"b": "é😀\u{7f}"}], "c": []});
        assert_eq!(
            render(nested.clone(), "tojson(ensure_ascii=true)"),
            r#"{"a": [1, {"b": "\u00e9\ud83d\ude00\u007f"}], "c": []}"#
        );
        let small = json!({"a": [1, 2], "c": {}});
        assert_eq!(
            render(small.clone(), "tojson(separators=[',', ':'])"),
            r#"{"a":[1,2],"c":{}}"#
        );
        assert_eq!(
            render(small, "tojson(indent=2, separators=[', ', ': '])"),
            "{\n  \"a\": [\n    1, \n    2\n  ], \n  \"c\": {}\n}"
        );
        assert_eq!(render(json!([]), "tojson(indent=2)"), "[]");
        assert_eq!(render(json!({"a": []}), "tojson(indent=0)"), "{\n\"a\": []\n}");
    }
}

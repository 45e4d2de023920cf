//! The model's chat template (Jinja, from `chat_template.jinja` or tokenizer_config.json's
//! `chat_template`), rendered with minijinja the way transformers renders it: trim_blocks,
//! lstrip_blocks, loop controls, Python string methods, `raise_exception`, `tojson` as Python
//! writes JSON (`python_json`), and mappings in their keys' order.

use crate::python_json::tojson;
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde_json::{Map, Value as Json};
use std::path::Path;
use thiserror::Error as ThisError;

/// Template variables by name.
pub type JsonMap = Map<String, Json>;

#[derive(Debug, ThisError)]
pub enum TemplateError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("{path}: invalid chat template: {source}")]
    Compile { path: String, source: Error },
    #[error("--chat-template {0}: no such file, and not a template either (it has no braces or newlines)")]
    NotFound(String),
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// The template of a model directory, or None when it has none; `chosen` (vLLM's
    /// `--chat-template`: a file, or the template itself) replaces the directory's own.
    pub fn from_dir(dir: &Path, chosen: Option<&str>) -> Result<Option<Self>, TemplateError> {
        let config_path = dir.join("tokenizer_config.json");
        let config = match config_path.exists() {
            true => read_json(&config_path)?,
            false => Json::Null,
        };
        let jinja_path = dir.join("chat_template.jinja");
        let (source, path) = match chosen {
            Some(chosen) => read_chosen(chosen)?,
            None if jinja_path.exists() => (read_text(&jinja_path)?, jinja_path.display().to_string()),
            None => match template_in_config(&config) {
                Some(text) => (text, config_path.display().to_string()),
                None => return Ok(None),
            },
        };
        let template = Self::new(
            &source,
            special_token(&config, "bos_token"),
            special_token(&config, "eos_token"),
        )
        .map_err(|source| TemplateError::Compile { path, source })?;
        Ok(Some(template))
    }

    pub fn new(source: &str, bos_token: String, eos_token: String) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_owned())?;
        Ok(Self {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The prompt text for `messages` (each a JSON object with `role` and `content`), ending
    /// with the assistant's turn header when `add_generation_prompt`. `extra` holds more
    /// template variables (a request's `chat_template_kwargs`, such as `enable_thinking`).
    pub fn render(&self, messages: &[Json], add_generation_prompt: bool, extra: &JsonMap) -> Result<String, Error> {
        self.env.get_template(NAME)?.render(context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            ..Value::from_serialize(extra)
        })
    }

    /// The prompt text with the final message left open for the model to continue: rendered
    /// without a new turn, then cut after the final message's text, as transformers does.
    /// Templates that trim messages render the trimmed text, so that is looked for next.
    pub fn render_continuing(&self, messages: &[Json], extra: &JsonMap) -> Result<String, Error> {
        let rendered = self.render(messages, false, extra)?;
        let last = messages.last().and_then(|m| m["content"].as_str()).unwrap_or_default();
        [last, last.trim()]
            .into_iter()
            .filter(|text| !text.is_empty())
            .find_map(|text| rendered.rfind(text).map(|at| rendered[..at + text.len()].to_string()))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidOperation,
                    "the final message's text does not appear in the rendered conversation, so it cannot be continued",
                )
            })
    }
}

/// A template given on the command line, with what names it in errors: the file it names,
/// else the text itself when it looks like a template (vLLM's rule), so that a mistyped path
/// is an error rather than a template that renders it.
fn read_chosen(chosen: &str) -> Result<(String, String), TemplateError> {
    let path = Path::new(chosen);
    if path.is_file() {
        return Ok((read_text(path)?, chosen.to_owned()));
    }
    if chosen.contains(['{', '}', '\n']) {
        return Ok((chosen.to_owned(), "--chat-template".to_owned()));
    }
    Err(TemplateError::NotFound(chosen.to_owned()))
}

fn read_text(path: &Path) -> Result<String, TemplateError> {
    std::fs::read_to_string(path).map_err(|source| TemplateError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn read_json(path: &Path) -> Result<Json, TemplateError> {
    let text = read_text(path)?;
    serde_json::from_str(&text).map_err(|source| TemplateError::Json {
        path: path.display().to_string(),
        source,
    })
}

/// `chat_template` is a string, or a list of named templates of which "default" is used.
fn template_in_config(config: &Json) -> Option<String> {
    match &config["chat_template"] {
        Json::String(s) => Some(s.clone()),
        Json::Array(named) => named
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_owned),
        _ => None,
    }
}

/// A special token given as a string or as an AddedToken object `{"content": ...}`.
fn special_token(config: &Json, key: &str) -> String {
    let v = &config[key];
    v.as_str()
        .or_else(|| v["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `--chat-template`: a file, or the template itself, replaces the directory's own and
    /// keeps its special tokens; a path that names nothing is an error, not a template.
    #[test]
    fn a_chosen_template_replaces_the_models_own() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            json!({"chat_template": "own", "bos_token": "<s>"}).to_string(),
        )
        .unwrap();
        let messages = [json!({"role": "user", "content": "hi"})];
        let render = |chosen: Option<&str>| {
            let template = ChatTemplate::from_dir(dir.path(), chosen).unwrap().unwrap();
            template.render(&messages, false, &JsonMap::new()).unwrap()
        };
        assert_eq!(render(None), "own");
        let inline = "{{ bos_token }}{{ messages[0].content }}";
        assert_eq!(render(Some(inline)), "<s>hi");
        let file = dir.path().join("mine.jinja");
        std::fs::write(&file, "[{{ messages[0].role }}]").unwrap();
        assert_eq!(render(Some(file.to_str().unwrap())), "[user]");
        let missing = ChatTemplate::from_dir(dir.path(), Some("templates/missing.jinja")).err();
        assert!(matches!(missing, Some(TemplateError::NotFound(_))), "{missing:?}");
        let broken = ChatTemplate::from_dir(dir.path(), Some("{% for %}")).err();
        assert!(matches!(broken, Some(TemplateError::Compile { .. })), "{broken:?}");
    }

    #[test]
    fn renders_like_transformers() {
        let source =
            "{{ bos_token }}{% for m in messages %}\n<|{{ m['role'] }}|>{{ m.content.strip() }}\n  {% endfor %}\
                      {% if add_generation_prompt %}<|assistant|>{% endif %}";
        let t = ChatTemplate::new(source, "<s>".into(), "</s>".into()).unwrap();
        let messages = [
            json!({"role": "user", "content": " hi "}),
            json!({"role": "assistant", "content": "yo"}),
        ];
        assert_eq!(
            t.render(&messages, true, &JsonMap::new()).unwrap(),
            "<s><|user|>hi\n<|assistant|>yo\n<|assistant|>"
        );
        assert_eq!(
            t.render(&messages, false, &JsonMap::new()).unwrap(),
            "<s><|user|>hi\n<|assistant|>yo\n"
        );
        // Request variables reach the template.
        let thinking = ChatTemplate::new(
            "{% if enable_thinking is false %}no{% else %}yes{% endif %}",
            String::new(),
            String::new(),
        )
        .unwrap();
        let off = json!({"enable_thinking": false}).as_object().unwrap().clone();
        assert_eq!(thinking.render(&messages, true, &JsonMap::new()).unwrap(), "yes");
        assert_eq!(thinking.render(&messages, true, &off).unwrap(), "no");
    }

    #[test]
    fn continuing_leaves_the_final_message_open() {
        let source = "{% for m in messages %}<|{{ m['role'] }}|>{{ m.content.strip() }}<|end|>{% endfor %}\
                      {% if add_generation_prompt %}<|assistant|>{% endif %}";
        let t = ChatTemplate::new(source, String::new(), String::new()).unwrap();
        let mut messages = vec![
            json!({"role": "user", "content": "say yo"}),
            json!({"role": "assistant", "content": "yo, "}),
        ];
        // The template trims the message, so its trimmed text is what ends the prompt.
        assert_eq!(
            t.render_continuing(&messages, &JsonMap::new()).unwrap(),
            "<|user|>say yo<|end|><|assistant|>yo,"
        );
        messages[1] = json!({"role": "assistant", "content": "yo"});
        assert_eq!(
            t.render_continuing(&messages, &JsonMap::new()).unwrap(),
            "<|user|>say yo<|end|><|assistant|>yo"
        );
        let hidden = ChatTemplate::new(
            "{% for m in messages %}<|{{ m['role'] }}|>{% endfor %}",
            String::new(),
            String::new(),
        )
        .unwrap();
        let err = hidden.render_continuing(&messages, &JsonMap::new()).unwrap_err();
        assert!(err.to_string().contains("cannot be continued"), "{err}");
    }

    #[test]
    fn raise_exception_fails_the_render() {
        let t = ChatTemplate::new(
            "{{ raise_exception('roles must alternate') }}",
            String::new(),
            String::new(),
        )
        .unwrap();
        let err = t.render(&[], true, &JsonMap::new()).unwrap_err();
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn finds_named_templates_and_token_objects() {
        let config = json!({
            "chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "y"}],
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>"
        });
        assert_eq!(template_in_config(&config).as_deref(), Some("y"));
        assert_eq!(special_token(&config, "bos_token"), "<s>");
        assert_eq!(special_token(&config, "eos_token"), "</s>");
    }
}

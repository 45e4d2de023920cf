//! What the HTTP layer knows of the model: the name clients use, its tokenizer and its chat
//! format (a chat template, or harmony for gpt-oss). The weights live in the engine.

use crate::chat_template::{ChatTemplate, TemplateError};
use crate::constraints::Constraints;
use crate::error::ApiError;
use crate::harmony::Harmony;
use crate::params::prompt_too_long;
use crate::protocol::unix_time;
use crate::thinking::ReasoningParser;
use peagle_engine::special_token_ids;
use peagle_models::SamplingDefaults;
use std::collections::HashSet;
use std::path::Path;
use thiserror::Error;
use tokenizers::Tokenizer;

#[derive(Debug, Error)]
pub enum ModelFilesError {
    #[error("{path}: {message}")]
    Tokenizer { path: String, message: String },
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("--tool-call-parser {0}")]
    ToolCallParser(String),
    #[error("--reasoning-parser {0}")]
    ReasoningParser(String),
}

/// The parsers the server was told to split answers with (`--tool-call-parser`,
/// `--reasoning-parser`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Parsers {
    pub tool_call: Option<ToolCallParser>,
    pub reasoning: Option<ReasoningParser>,
}

/// How a model's answers carry tool calls (`--tool-call-parser`, vLLM's names): `openai`,
/// harmony's messages to `functions.NAME` (gpt-oss, which has no other way), `hermes`,
/// `<tool_call>` blocks in the text (`hermes.rs`), or `llama3_json`, an answer of JSON objects
/// (`llama3_json.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallParser {
    Openai,
    Hermes,
    Llama3Json,
}

impl std::fmt::Display for ToolCallParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Openai => "openai",
            Self::Hermes => "hermes",
            Self::Llama3Json => "llama3_json",
        })
    }
}

impl std::str::FromStr for ToolCallParser {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "openai" => Ok(Self::Openai),
            "hermes" => Ok(Self::Hermes),
            "llama3_json" => Ok(Self::Llama3Json),
            other => Err(format!(
                "{other:?} is not a tool call parser: expected openai, hermes or llama3_json"
            )),
        }
    }
}

pub struct ServedModel {
    pub name: String,
    tokenizer: Tokenizer,
    /// Special tokens (end of text, turn markers): kept out of the text, as vLLM's
    /// skip_special_tokens does.
    special_ids: HashSet<u32>,
    pub chat_template: Option<ChatTemplate>,
    /// Set for gpt-oss: chats are rendered and parsed as harmony, not by the template.
    pub harmony: Option<Harmony>,
    /// A chat template's model's tool call parser, where the server was given one; a harmony
    /// model's calls are harmony's, and it has none here.
    pub tool_call_parser: Option<ToolCallParser>,
    /// A chat template's model's reasoning parser, likewise.
    pub reasoning_parser: Option<ReasoningParser>,
    /// What requests that leave sampling fields out get (`--generation-config`).
    pub sampling_defaults: SamplingDefaults,
    /// Unix time the server started, reported as the model's `created`.
    pub created: u64,
    /// Text of more than this many bytes per token of the limit cannot fit (see `encode`).
    max_bytes_per_token: usize,
    /// Structured outputs compiled for this model's vocabulary.
    pub constraints: Constraints,
}

type ChosenParsers = (Option<ToolCallParser>, Option<ReasoningParser>);

/// A harmony model's parsers: harmony's own, which its channels are, so none here; naming
/// them is allowed, as vLLM's command lines do.
fn harmony_parsers(parsers: Parsers) -> Result<ChosenParsers, ModelFilesError> {
    if let Some(parser) = parsers.tool_call.filter(|p| *p != ToolCallParser::Openai) {
        return Err(ModelFilesError::ToolCallParser(format!(
            "{parser}: this model speaks harmony, whose tool calls are openai's"
        )));
    }
    if let Some(parser) = parsers.reasoning.filter(|p| *p != ReasoningParser::OpenaiGptoss) {
        return Err(ModelFilesError::ReasoningParser(format!(
            "{parser}: this model speaks harmony, whose reasoning is openai_gptoss's"
        )));
    }
    Ok((None, None))
}

/// A chat template's model's parsers: those given, but harmony's.
fn template_parsers(parsers: Parsers) -> Result<ChosenParsers, ModelFilesError> {
    let not_harmony = "this model does not speak harmony (gpt-oss's format)";
    if parsers.tool_call == Some(ToolCallParser::Openai) {
        return Err(ModelFilesError::ToolCallParser(format!(
            "openai: {not_harmony}; hermes and llama3_json parse other models' calls"
        )));
    }
    if parsers.reasoning == Some(ReasoningParser::OpenaiGptoss) {
        return Err(ModelFilesError::ReasoningParser(format!(
            "openai_gptoss: {not_harmony}; qwen3 and deepseek_r1 parse <think>"
        )));
    }
    Ok((parsers.tool_call, parsers.reasoning))
}

/// How much a normalizer can shrink text: composing characters (NFC, NFKC) turns at most three
/// code points into one of a third of their bytes (Hangul jamo into a syllable).
const NORMALIZER_SHRINK: usize = 3;

/// Tokenizing text this long allocates hundreds of MB, which glibc keeps in the tokenizing
/// thread's arena unless asked to give it back.
const TRIM_AFTER_BYTES: usize = 1 << 20;

impl ServedModel {
    /// Reads `tokenizer.json` and the chat template of a model directory, or `chat_template`
    /// (a file or the template itself) instead of the directory's. A harmony model's tool calls
    /// and reasoning are harmony's (`openai`, `openai_gptoss`); another's are split by the
    /// `parsers` given, which must not be harmony's.
    pub fn from_dir(
        name: String,
        dir: &Path,
        chat_template: Option<&str>,
        parsers: Parsers,
    ) -> Result<Self, ModelFilesError> {
        let path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| ModelFilesError::Tokenizer {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let harmony = Harmony::detect(dir, &tokenizer);
        let (tool_call_parser, reasoning_parser) = match harmony {
            Some(_) => harmony_parsers(parsers)?,
            None => template_parsers(parsers)?,
        };
        Ok(Self {
            harmony,
            tool_call_parser,
            reasoning_parser,
            ..Self::new(name, tokenizer, ChatTemplate::from_dir(dir, chat_template)?)
        })
    }

    pub fn new(name: String, tokenizer: Tokenizer, chat_template: Option<ChatTemplate>) -> Self {
        let special_ids = special_token_ids(&tokenizer);
        // A vocabulary entry is spelled in at least as many bytes as its token decodes to
        // (byte-level BPE spells a byte in one or two, SentencePiece a space as the 3-byte ▁).
        let longest_entry = tokenizer.get_vocab(true).keys().map(String::len).max().unwrap_or(1);
        Self {
            max_bytes_per_token: longest_entry.max(1) * NORMALIZER_SHRINK,
            name,
            tokenizer,
            special_ids,
            chat_template,
            harmony: None,
            tool_call_parser: None,
            reasoning_parser: None,
            sampling_defaults: SamplingDefaults::default(),
            created: unix_time(),
            constraints: Constraints::default(),
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// Token ids of the prompt `text` (the field `param`); `add_special_tokens` adds what the
    /// tokenizer's post-processor adds (a BOS, say), which a rendered chat template already
    /// contains. Text too long to fit `max_model_len` is refused before it is tokenized: no
    /// token stands for more than `max_bytes_per_token` of its bytes, so its length in bytes
    /// bounds its length in tokens from below.
    pub fn encode(
        &self,
        text: &str,
        add_special_tokens: bool,
        max_model_len: usize,
        param: &str,
    ) -> Result<Vec<u32>, ApiError> {
        let at_least = text.len() / self.max_bytes_per_token;
        if at_least >= max_model_len {
            return Err(prompt_too_long(
                format_args!("at least {at_least}"),
                max_model_len,
                param,
            ));
        }
        let ids = self.ids(text, add_special_tokens);
        if text.len() > TRIM_AFTER_BYTES {
            give_back_freed_memory();
        }
        ids
    }

    /// Token ids of a short `text` that is not a prompt (a bad word), without the special
    /// tokens a prompt's post-processor adds.
    pub fn encode_words(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.ids(text, false)
    }

    fn ids(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ApiError> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| ApiError::internal(format!("tokenizer: {e}")))
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, ApiError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| ApiError::internal(format!("tokenizer: {e}")))
    }

    /// Token ids a client may send as a prompt.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }
}

#[cfg(target_env = "gnu")]
fn give_back_freed_memory() {
    // SAFETY: malloc_trim only returns free heap pages to the system.
    unsafe { libc::malloc_trim(0) };
}

#[cfg(not(target_env = "gnu"))]
fn give_back_freed_memory() {}

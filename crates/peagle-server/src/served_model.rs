//! What the HTTP layer knows of the model: the name clients use, its tokenizer and its chat
//! format (a chat template, or harmony for gpt-oss). The weights live in the engine.

use crate::chat_template::{ChatTemplate, TemplateError};
use crate::error::ApiError;
use crate::harmony::Harmony;
use crate::protocol::unix_time;
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
    /// What requests that leave sampling fields out get (`--generation-config`).
    pub sampling_defaults: SamplingDefaults,
    /// Unix time the server started, reported as the model's `created`.
    pub created: u64,
}

impl ServedModel {
    /// Reads `tokenizer.json` and the chat template of a model directory.
    pub fn from_dir(name: String, dir: &Path) -> Result<Self, ModelFilesError> {
        let path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| ModelFilesError::Tokenizer {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let harmony = Harmony::detect(dir, &tokenizer);
        Ok(Self {
            harmony,
            ..Self::new(name, tokenizer, ChatTemplate::from_dir(dir)?)
        })
    }

    pub fn new(name: String, tokenizer: Tokenizer, chat_template: Option<ChatTemplate>) -> Self {
        let special_ids = special_token_ids(&tokenizer);
        Self {
            name,
            tokenizer,
            special_ids,
            chat_template,
            harmony: None,
            sampling_defaults: SamplingDefaults::default(),
            created: unix_time(),
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.contains(&id)
    }

    /// Token ids of `text`; `add_special_tokens` adds what the tokenizer's post-processor adds
    /// (a BOS, say), which a rendered chat template already contains.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ApiError> {
        self.tokenizer
            .encode(text, add_special_tokens)
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

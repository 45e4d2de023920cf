//! Incremental detokenization for streaming: emit text only once it is stable.
//!
//! Byte-level BPE tokens can split a UTF-8 character, and decoding is not always the
//! concatenation of per-token decodes (spaces, merges). So, as vLLM and HF's TextStreamer do,
//! decode a short window of recent tokens and emit only what extends the previously emitted
//! text and does not end in a partial character.

use tokenizers::Tokenizer;

pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the window whose decode is compared.
    prefix_offset: usize,
    /// Tokens already turned into emitted text.
    read_offset: usize,
}

impl Default for IncrementalDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl IncrementalDecoder {
    pub fn new() -> Self {
        Self {
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// Adds one token and returns the newly stable text (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> tokenizers::Result<String> {
        self.ids.push(id);
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], false)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], false)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.starts_with(&prefix) {
            let new = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            return Ok(new);
        }
        Ok(String::new())
    }

    /// Whatever is left, including an incomplete character, once generation ends.
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> tokenizers::Result<String> {
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], false)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], false)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(full.get(prefix.len()..).unwrap_or_default().to_string())
    }
}

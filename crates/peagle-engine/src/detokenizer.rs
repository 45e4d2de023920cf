//! Incremental detokenization for streaming: emit text only once it is stable.
//!
//! Byte-level BPE tokens can split a UTF-8 character, and decoding is not always the
//! concatenation of per-token decodes (spaces, merges). So, as vLLM and HF's TextStreamer do,
//! decode a short window of recent tokens and emit only what extends the previously emitted
//! text and does not end in a partial character.

use std::collections::HashSet;
use tokenizers::Tokenizer;

/// The tokenizer's special tokens (end of text, turn markers), which add no text to an output
/// under vLLM's default `skip_special_tokens`.
pub fn special_token_ids(tokenizer: &Tokenizer) -> HashSet<u32> {
    tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, token)| token.special)
        .map(|(id, _)| id)
        .collect()
}

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

    /// Whatever is left once generation ends, but an incomplete last character: it never
    /// became text, and vLLM does not emit it either.
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> tokenizers::Result<String> {
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], false)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], false)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        let rest = full.get(prefix.len()..).unwrap_or_default();
        Ok(rest.trim_end_matches('\u{FFFD}').to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo_tokenizer() -> Tokenizer {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/pystdlib-12l/tokenizer.json");
        Tokenizer::from_file(path).unwrap()
    }

    fn decode_all(tokenizer: &Tokenizer, ids: &[u32]) -> String {
        let mut decoder = IncrementalDecoder::new();
        let mut text: String = ids.iter().map(|id| decoder.push(tokenizer, *id).unwrap()).collect();
        text.push_str(&decoder.flush(tokenizer).unwrap());
        text
    }

    #[test]
    fn streamed_text_is_the_whole_decode_and_drops_an_unfinished_character() {
        let tokenizer = demo_tokenizer();
        let ids = tokenizer.encode("x = '日本語' # ok", false).unwrap().get_ids().to_vec();
        assert_eq!(decode_all(&tokenizer, &ids), "x = '日本語' # ok");
        // The bytes of "日" come in several tokens: cut before its last one, nothing of it shows.
        let cut = tokenizer.encode("x = '日", false).unwrap().get_ids().to_vec();
        assert!(tokenizer
            .decode(&cut[..cut.len() - 1], false)
            .unwrap()
            .ends_with('\u{FFFD}'));
        assert_eq!(decode_all(&tokenizer, &cut[..cut.len() - 1]), "x = '");
    }
}

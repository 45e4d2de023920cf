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

/// Prompt tokens a decoder decodes the output after, as vLLM's detokenizer does.
const PROMPT_CONTEXT: usize = 5;

pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the window whose decode is compared.
    prefix_offset: usize,
    /// Tokens already turned into emitted text.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder for the tokens that follow `prompt`. Its text is decoded after the prompt's
    /// last few tokens, not alone: SentencePiece decoders (Metaspace, Llama 2's Strip) drop the
    /// space a decode starts with, which would take the space off the first token's text (" Paris"
    /// after "is"). A tail that ends in an unfinished character would hold the output back, so
    /// then the output is decoded alone.
    pub fn after(tokenizer: &Tokenizer, prompt: &[u32]) -> tokenizers::Result<Self> {
        let mut tail = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        if tokenizer.decode(tail, false)?.ends_with('\u{FFFD}') {
            tail = &[];
        }
        Ok(Self {
            ids: tail.to_vec(),
            prefix_offset: 0,
            read_offset: tail.len(),
        })
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
        decode_after(tokenizer, &[], ids)
    }

    fn decode_after(tokenizer: &Tokenizer, prompt: &[u32], ids: &[u32]) -> String {
        let mut decoder = IncrementalDecoder::after(tokenizer, prompt).unwrap();
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

    /// Random token sequences of the demo's byte-level vocabulary, half of them tokens whose
    /// text is part of a character (so characters split, and bytes go invalid, at every
    /// place): the streamed text is the whole decode, but an unfinished last character. (Not
    /// so for byte fallback, whose whole decode turns a run of byte tokens that is not all
    /// UTF-8 into a U+FFFD a byte, its whole characters too, which the stream keeps.)
    #[test]
    fn random_tokens_stream_as_they_decode_whole() {
        use rand::rngs::StdRng;
        use rand::seq::IndexedRandom;
        use rand::{Rng, SeedableRng};
        let tokenizer = demo_tokenizer();
        let vocab = tokenizer.get_vocab_size(false) as u32;
        let partial: Vec<u32> = (0..vocab)
            .filter(|&id| tokenizer.decode(&[id], false).unwrap().contains('\u{FFFD}'))
            .collect();
        assert!(partial.len() > 100, "{} partial tokens", partial.len());
        let mut r = StdRng::seed_from_u64(20261203);
        for _ in 0..500 {
            let ids: Vec<u32> = (0..r.random_range(1..=20))
                .map(|_| match r.random_bool(0.5) {
                    true => *partial.choose(&mut r).unwrap(),
                    false => r.random_range(0..vocab),
                })
                .collect();
            let whole = tokenizer.decode(&ids, false).unwrap();
            assert_eq!(
                decode_all(&tokenizer, &ids),
                whole.trim_end_matches('\u{FFFD}'),
                "{ids:?}"
            );
        }
    }

    /// A SentencePiece tokenizer as Llama 2's is built: words that start with "▁", and a
    /// decoder that drops the space a decode starts with.
    fn sentencepiece_tokenizer() -> Tokenizer {
        let vocab = [
            "<unk>",
            "▁The",
            "▁capital",
            "▁is",
            "▁Paris",
            ".",
            "<0xE6>",
            "<0x97>",
            "<0xA5>",
        ];
        let vocab: serde_json::Map<String, serde_json::Value> = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i.into()))
            .collect();
        let metaspace =
            serde_json::json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true});
        let json = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": metaspace,
            "post_processor": null,
            "decoder": {"type": "Sequence", "decoders": [metaspace, {"type": "ByteFallback"}, {"type": "Fuse"}]},
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
        });
        json.to_string().parse().unwrap()
    }

    #[test]
    fn the_first_token_keeps_its_space_after_the_prompt() {
        let tokenizer = sentencepiece_tokenizer();
        let prompt = tokenizer.encode("The capital is", false).unwrap().get_ids().to_vec();
        assert_eq!(prompt, [1, 2, 3]);
        assert_eq!(
            tokenizer.decode(&[4, 5], false).unwrap(),
            "Paris.",
            "a decode drops its first space"
        );
        assert_eq!(decode_after(&tokenizer, &prompt, &[4, 5]), " Paris.");
        // A prompt that ends inside a character (token ids, cut) is not decoded before it.
        assert_eq!(decode_after(&tokenizer, &[1, 6, 7], &[4]), "Paris");
        assert_eq!(decode_after(&tokenizer, &[1, 6, 7, 8], &[4]), " Paris");
    }
}

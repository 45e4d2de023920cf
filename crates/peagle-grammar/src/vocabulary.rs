//! The bytes each token of a model's vocabulary stands for, and a trie over them, so that a
//! parse state's allowed tokens are found by walking shared prefixes once.

use crate::error::GrammarError;
use crate::trie::Trie;
use std::collections::HashMap;
use tokenizers::Tokenizer;

pub struct Vocabulary {
    /// Each token's bytes; None for tokens that are not text (special tokens, and ids the
    /// model has past the tokenizer's).
    tokens: Vec<Option<Box<[u8]>>>,
    trie: Trie,
}

impl Vocabulary {
    /// A vocabulary of `tokens`, by id.
    pub fn new(tokens: Vec<Option<Vec<u8>>>) -> Self {
        let tokens: Vec<Option<Box<[u8]>>> = tokens
            .into_iter()
            .map(|t| t.filter(|b| !b.is_empty()).map(Vec::into_boxed_slice))
            .collect();
        let text = tokens
            .iter()
            .enumerate()
            .filter_map(|(id, bytes)| Some((id as u32, bytes.as_deref()?)))
            .collect();
        let trie = Trie::new(text);
        Self { tokens, trie }
    }

    /// A model's vocabulary from its tokenizer: byte-level BPE (GPT-2's byte alphabet) and
    /// SentencePiece (`▁` for a space, `<0xNN>` byte fallbacks) say which bytes each token
    /// is; other decoders are refused. A model's rows past the tokenizer's ids are no text,
    /// which `bytes` says of any id past `len`.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Result<Self, GrammarError> {
        let decoder = serde_json::to_string(&tokenizer.get_decoder()).unwrap_or_default();
        let byte_level = decoder.contains("\"ByteLevel\"");
        if !byte_level && !decoder.contains("\"ByteFallback\"") && !decoder.contains("\"Metaspace\"") {
            return Err(GrammarError::Tokenizer(decoder));
        }
        let added = tokenizer.get_added_tokens_decoder();
        let unicode_byte = byte_level_alphabet();
        let tokens = (0..tokenizer.get_vocab_size(true) as u32)
            .map(|id| {
                if let Some(token) = added.get(&id) {
                    return (!token.special).then(|| token.content.as_bytes().to_vec());
                }
                let piece = tokenizer.id_to_token(id)?;
                Some(match byte_level {
                    true => piece
                        .chars()
                        .map(|c| unicode_byte.get(&c).copied())
                        .collect::<Option<Vec<u8>>>()?,
                    false => sentencepiece_bytes(&piece),
                })
            })
            .collect();
        Ok(Self::new(tokens))
    }

    /// How many tokens the tokenizer has.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The bytes of `token`; None for a token that is not text.
    pub fn bytes(&self, token: u32) -> Option<&[u8]> {
        self.tokens.get(token as usize)?.as_deref()
    }

    /// The text tokens' trie.
    pub(crate) fn trie(&self) -> &Trie {
        &self.trie
    }
}

/// GPT-2's byte-level alphabet, from the character back to its byte: printable bytes stand
/// for themselves, the others for the characters from U+0100 on, in order.
fn byte_level_alphabet() -> HashMap<char, u8> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                b as u32
            } else {
                next += 1;
                next - 1
            };
            (char::from_u32(c).expect("a valid character"), b)
        })
        .collect()
}

/// A SentencePiece piece's bytes: `<0xNN>` is that byte, `▁` a space.
fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    let hex = piece
        .strip_prefix("<0x")
        .and_then(|h| h.strip_suffix('>'))
        .filter(|h| h.len() == 2);
    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
        Some(b) => vec![b],
        None => piece.replace('\u{2581}', " ").into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn fixture(path: &str) -> Tokenizer {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(path);
        Tokenizer::from_file(root).unwrap()
    }

    /// Every text token's bytes, one after another, are what the tokenizer decodes a text to
    /// (here the bundled demo model's byte-level BPE, on text with multi-byte characters).
    #[test]
    fn byte_level_tokens_concatenate_to_the_decoded_text() {
        let tokenizer = fixture("models/pystdlib-12l/tokenizer.json");
        let size = tokenizer.get_vocab_size(true);
        let vocab = Vocabulary::from_tokenizer(&tokenizer).unwrap();
        assert_eq!(vocab.len(), size);
        assert_eq!(
            vocab.bytes(size as u32 + 1),
            None,
            "ids past the tokenizer's are not text"
        );
        let text = "def f(x):\n    return {\"k\": [1, 2.5]}  # naïve 日本\n";
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| vocab.bytes(id).unwrap().to_vec()).collect();
        assert_eq!(
            String::from_utf8(bytes).unwrap(),
            tokenizer.decode(&ids, false).unwrap()
        );
        let specials: Vec<u32> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, _)| id)
            .collect();
        assert!(!specials.is_empty());
        assert!(
            specials.iter().all(|&id| vocab.bytes(id).is_none()),
            "special tokens are not text"
        );
    }

    /// Tokens with no bytes, or none that are text, are in no trie node; tokens with the
    /// same bytes end at the same one.
    #[test]
    fn only_text_tokens_are_in_the_trie() {
        let vocab = Vocabulary::new(vec![Some(b"a".to_vec()), None, Some(Vec::new()), Some(b"a".to_vec())]);
        assert_eq!(vocab.bytes(1), None);
        assert_eq!(vocab.bytes(2), None, "an empty token is not text");
        assert_eq!(vocab.trie().len(), 1);
        assert_eq!(vocab.trie().tokens(0), [0, 3]);
    }

    #[test]
    fn sentencepiece_pieces_map_spaces_and_byte_fallbacks() {
        assert_eq!(sentencepiece_bytes("\u{2581}the"), b" the");
        assert_eq!(sentencepiece_bytes("<0xE6>"), [0xe6]);
        assert_eq!(sentencepiece_bytes("<0xZZ>"), b"<0xZZ>");
    }
}

//! The bytes each token of a model's vocabulary stands for, and a trie over them, so that a
//! parse state's allowed tokens are found by walking shared prefixes once.
//!
//! A token that is no text (a special token such as harmony's `<|call|>`) is spelled
//! `special_token_bytes(id)`: a byte that UTF-8 never holds, then its id. Text tokens holding
//! that byte (bytes of no UTF-8 text) are spelled the same way, so that a grammar can name a
//! special token, and only that token can match the name: no grammar's text takes the mark.

use crate::error::GrammarError;
use crate::trie::Trie;
use std::collections::HashMap;
use tokenizers::Tokenizer;

/// The first byte of a special token's spelling: 0xFF is in no UTF-8 text.
pub const SPECIAL_MARK: u8 = 0xFF;

/// How a grammar spells the token `id` that is no text: the mark, then the id's low three
/// bytes (most significant first), which covers every vocabulary of fewer than 2^24 tokens.
pub fn special_token_bytes(id: u32) -> [u8; 4] {
    let [_, high, mid, low] = id.to_be_bytes();
    [SPECIAL_MARK, high, mid, low]
}

pub struct Vocabulary {
    /// Each token's bytes: its text, or its special spelling.
    tokens: Vec<Box<[u8]>>,
    trie: Trie,
    /// The special tokens' names (their text in a chat template, `<|call|>`), with their ids.
    special_names: Vec<(String, u32)>,
}

impl Vocabulary {
    /// A vocabulary of `tokens`, by id: each one's text, or None for one that is no text
    /// (special tokens, and ids the model has past the tokenizer's). An empty text, or one
    /// holding the special mark, is no text either.
    pub fn new(tokens: Vec<Option<Vec<u8>>>) -> Self {
        let tokens: Vec<Box<[u8]>> = tokens
            .into_iter()
            .enumerate()
            .map(
                |(id, t)| match t.filter(|b| !b.is_empty() && !b.contains(&SPECIAL_MARK)) {
                    Some(text) => text.into_boxed_slice(),
                    None => Box::new(special_token_bytes(id as u32)),
                },
            )
            .collect();
        let spelled = tokens
            .iter()
            .enumerate()
            .map(|(id, bytes)| (id as u32, &bytes[..]))
            .collect();
        let trie = Trie::new(spelled);
        Self {
            tokens,
            trie,
            special_names: Vec::new(),
        }
    }

    /// This vocabulary, its special tokens named: a structure's text that holds a name means
    /// the token (`structure::Literal`). Names of tokens that are text are left out.
    pub fn with_special_names(mut self, names: impl IntoIterator<Item = (String, u32)>) -> Self {
        self.special_names = names
            .into_iter()
            .filter(|(name, id)| !name.is_empty() && self.is_spelled_by_id(*id))
            .collect();
        self
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
        let names = added
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, token)| (token.content, id));
        Ok(Self::new(tokens).with_special_names(names))
    }

    /// How many tokens the tokenizer has.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The bytes of `token` (its text or its special spelling); None past the vocabulary.
    pub fn bytes(&self, token: u32) -> Option<&[u8]> {
        self.tokens.get(token as usize).map(|b| &b[..])
    }

    /// Whether `token` is one of the vocabulary's and no text: spelled by its id.
    pub fn is_spelled_by_id(&self, token: u32) -> bool {
        self.bytes(token) == Some(&special_token_bytes(token)[..])
    }

    /// The special tokens' names and ids.
    pub fn special_names(&self) -> &[(String, u32)] {
        &self.special_names
    }

    /// The tokens' trie.
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
            specials
                .iter()
                .all(|&id| vocab.bytes(id) == Some(&special_token_bytes(id)[..])),
            "special tokens are spelled by their ids"
        );
    }

    /// Tokens that are no text (none, empty, or holding the special mark) are spelled by
    /// their ids, each its own trie leaf under the mark; tokens with the same text end at the
    /// same node.
    #[test]
    fn tokens_that_are_no_text_are_spelled_by_their_ids() {
        let tokens = vec![
            Some(b"a".to_vec()),
            None,
            Some(Vec::new()),
            Some(b"a".to_vec()),
            Some(vec![b'b', SPECIAL_MARK]),
        ];
        let vocab = Vocabulary::new(tokens);
        assert_eq!(vocab.bytes(0), Some(&b"a"[..]));
        for id in [1, 2, 4] {
            assert_eq!(vocab.bytes(id), Some(&[SPECIAL_MARK, 0, 0, id as u8][..]));
        }
        assert_eq!(special_token_bytes(0x0003_0d40), [SPECIAL_MARK, 3, 13, 64]);
        // "a", then the mark, "\0", "\0" shared by the three spellings and a leaf each.
        assert_eq!(vocab.trie().len(), 1 + 3 + 3);
        assert_eq!(vocab.trie().tokens(0), [0, 3]);
    }

    #[test]
    fn sentencepiece_pieces_map_spaces_and_byte_fallbacks() {
        assert_eq!(sentencepiece_bytes("\u{2581}the"), b" the");
        assert_eq!(sentencepiece_bytes("<0xE6>"), [0xe6]);
        assert_eq!(sentencepiece_bytes("<0xZZ>"), b"<0xZZ>");
    }
}

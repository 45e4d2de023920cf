//! Structured output's cost per new parse state: the tokens a state allows, found by walking
//! the vocabulary's trie (what a grammar constraint does once per state it meets), for the
//! demo model's 8192 tokens and a made-up vocabulary of gpt-oss's size (201,088), in three
//! states of a JSON schema's text: an object's start, a string's inside (where nearly every
//! token fits) and a number's digits.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use peagle_grammar::{Constraint, Spec, State, Vocabulary};
use std::hint::black_box;
use std::sync::Arc;

/// A vocabulary of `size` tokens shaped like a byte-level BPE's: the 256 bytes, then words
/// with and without a leading space, numbers, punctuation runs and JSON-ish pieces, drawn from
/// a fixed seed.
fn made_up_vocabulary(size: usize) -> Vocabulary {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |m: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % m
    };
    let mut tokens: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
    let letters = b"etaoinshrdlcumwfgypbvkjxqz";
    while tokens.len() < size {
        let mut token = Vec::new();
        match next(10) {
            0..=5 => {
                if next(2) == 0 {
                    token.push(b' ');
                }
                for _ in 0..1 + next(9) {
                    token.push(letters[(next(26) * next(26) / 25) as usize]);
                }
            }
            6 => token.extend(next(100_000).to_string().bytes()),
            7 => token.extend((0..1 + next(3)).map(|_| b"{}[]\":,. \n"[next(10) as usize])),
            8 => {
                token.extend(b"\"");
                token.extend((0..1 + next(6)).map(|_| letters[next(26) as usize]));
                token.extend([b"\":", b"\",", b"\" "][next(3) as usize]);
            }
            _ => token.extend(
                "éüñ日本語中文"
                    .chars()
                    .nth(next(8) as usize)
                    .unwrap()
                    .to_string()
                    .bytes(),
            ),
        }
        tokens.push(Some(token));
    }
    Vocabulary::new(tokens)
}

fn demo_vocabulary() -> Vocabulary {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/pystdlib-12l/tokenizer.json");
    let tokenizer = tokenizers::Tokenizer::from_file(path).unwrap();
    Vocabulary::from_tokenizer(&tokenizer).unwrap()
}

fn masks(c: &mut Criterion) {
    let spec = Spec::JsonSchema {
        schema: serde_json::json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
            "required": ["name", "count"]
        }),
        whitespace: None,
    };
    let states: [(&str, &[u8]); 3] = [
        ("object start", b""),
        ("inside a string", b"{\"name\": \"ab"),
        ("in a number", b"{\"name\": \"\", \"count\": 12"),
    ];
    for (name, vocab) in [
        ("demo 8192", demo_vocabulary()),
        ("made-up 201088", made_up_vocabulary(201_088)),
    ] {
        let vocab = Arc::new(vocab);
        let mut g = c.benchmark_group(format!("token mask of a new state, {name} tokens"));
        g.sample_size(10);
        for (state_name, text) in states {
            let fresh = || {
                let constraint = Constraint::new(spec.compile(&vocab).unwrap(), vocab.clone());
                let state: State = constraint.start();
                let grammar = spec.compile(&vocab).unwrap();
                let state = grammar.advance_bytes(&state, text);
                (constraint, state)
            };
            g.bench_function(state_name, |b| {
                b.iter_batched(fresh, |(c, s)| black_box(c.allowed(&s).count()), BatchSize::LargeInput)
            });
        }
        g.finish();
    }
}

criterion_group!(benches, masks);
criterion_main!(benches);

//! Logits and captured hidden states against HF transformers (scripts/make_fixtures.py), in
//! every way a sequence can be fed: whole prefill, chunks, one token at a time, mixed batches.

mod common;
use common::*;

const TOLERANCE: f32 = 1e-4;

fn check(f: &Fixture, prompt: usize, got: &Rowset, mode: &str) {
    let checks = [
        ("logits", &got.0, f.reference(prompt, "logits")),
        ("captured layer inputs", &got.1, f.reference_aux(prompt)),
        ("pre-norm final state", &got.2, f.reference(prompt, "prenorm")),
    ];
    for (what, ours, theirs) in checks {
        let diff = max_abs_diff(ours, &theirs);
        assert!(diff < TOLERANCE, "{mode}, prompt {prompt}, {what}: max abs diff {diff}");
    }
}

#[test]
fn prefill_in_one_call() {
    for name in FIXTURES {
        let f = Fixture::load(name);
        for p in 0..3 {
            let kv = f.cache();
            let out = run(f.model.as_ref(), &kv, &[(0, &f.prompt(p), 0)]);
            check(&f, p, &out[0], &format!("{name} one call"));
        }
    }
}

#[test]
fn prefill_in_chunks() {
    for name in FIXTURES {
        let f = Fixture::load(name);
        for p in 0..3 {
            let kv = f.cache();
            let prompt = f.prompt(p);
            let parts: Vec<Rowset> = prompt
                .chunks(7)
                .enumerate()
                .map(|(c, chunk)| run(f.model.as_ref(), &kv, &[(0, chunk, c * 7)]).remove(0))
                .collect();
            check(&f, p, &cat_rows(&parts), &format!("{name} chunks of 7"));
        }
    }
}

#[test]
fn token_by_token_decode() {
    for name in FIXTURES {
        let f = Fixture::load(name);
        for p in 0..3 {
            let kv = f.cache();
            let prompt = f.prompt(p);
            let parts: Vec<Rowset> = (0..prompt.len())
                .map(|i| run(f.model.as_ref(), &kv, &[(0, &prompt[i..i + 1], i)]).remove(0))
                .collect();
            check(&f, p, &cat_rows(&parts), &format!("{name} token by token"));
        }
    }
}

#[test]
fn mixed_batch_of_prefill_chunk_decode_and_fresh_prompt() {
    for name in FIXTURES {
        let f = Fixture::load(name);
        let kv = f.cache();
        let (p0, p1, p2) = (f.prompt(0), f.prompt(1), f.prompt(2));
        // Earlier steps: most of p0, the start of p1.
        let before0 = run(f.model.as_ref(), &kv, &[(0, &p0[..p0.len() - 1], 0)]).remove(0);
        let before1 = run(f.model.as_ref(), &kv, &[(1, &p1[..10], 0)]).remove(0);
        // One step mixing p0's last token (decode), the rest of p1 (chunk), all of p2 (prefill).
        let mixed = run(
            f.model.as_ref(),
            &kv,
            &[(0, &p0[p0.len() - 1..], p0.len() - 1), (1, &p1[10..], 10), (2, &p2, 0)],
        );
        check(
            &f,
            0,
            &cat_rows(&[before0, mixed[0].clone()]),
            &format!("{name} mixed decode"),
        );
        check(
            &f,
            1,
            &cat_rows(&[before1, mixed[1].clone()]),
            &format!("{name} mixed chunk"),
        );
        check(&f, 2, &mixed[2], &format!("{name} mixed prefill"));
    }
}

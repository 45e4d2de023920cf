//! Greedy speculative decoding emits exactly the tokens plain greedy decoding emits, for
//! P-EAGLE and EAGLE-3 at several K, on Llama, Qwen3 and gpt-oss targets, whether drafts are mostly rejected (random drafters) or
//! mostly accepted (a drafter that always proposes the token the target repeats).

use peagle_engine::{
    DraftModel, GenerateParams, Generator, GeneratorOptions, Penalties, SamplingParams, StructuredOutput, TokenBans,
};
use peagle_grammar::{Constraint, Spec, Vocabulary};
use peagle_models::{KvCacheDtype, LoadOptions};
use serde_json::json;
use std::sync::Arc;
mod common;
use common::{constant_drafter, fixture, repeating_prompt};
use std::path::Path;

fn generator(target: &str, draft: Option<(&Path, usize, bool)>, chunk: usize) -> Generator {
    let opts = GeneratorOptions {
        max_batched_tokens: chunk,
        ..Default::default()
    };
    generator_with(target, draft, &opts)
}

fn generator_with(target: &str, draft: Option<(&Path, usize, bool)>, opts: &GeneratorOptions) -> Generator {
    let draft = draft.map(|(dir, k, parallel)| DraftModel {
        dir: dir.to_owned(),
        k: Some(k),
        parallel,
    });
    Generator::from_dir(&fixture(target), draft.as_ref(), LoadOptions::default(), opts).unwrap()
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..GenerateParams::default()
    }
}

/// 20 prompts of 1 to 40 random token ids.
fn prompts() -> Vec<Vec<u32>> {
    let mut s = 12345u64;
    let mut next = move |m: u64| {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) % m
    };
    (0..20)
        .map(|_| (0..1 + next(40)).map(|_| 2 + next(380) as u32).collect())
        .collect()
}

fn outputs(g: &mut Generator, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    outputs_with(g, prompts, &greedy(max_tokens))
}

#[test]
fn random_drafters_never_change_greedy_output() {
    let prompts = prompts();
    let cases = [
        ("tiny-llama", "tiny-llama-peagle", true),
        ("tiny-llama", "tiny-llama-peagle", false),
        ("tiny-llama", "tiny-llama-peagle-aws", true),
        ("tiny-qwen3", "tiny-qwen3-eagle3", false),
        // gpt-oss (sinks, sliding window, MXFP4 experts) under its own head in the published
        // layout and a speculators-format one of its width.
        ("tiny-gpt-oss-mxfp4", "tiny-llama-peagle", true),
        ("tiny-gpt-oss-mxfp4", "tiny-gpt-oss-peagle", true),
        ("tiny-gpt-oss-mxfp4", "tiny-qwen3-eagle3", false),
    ];
    for target in ["tiny-llama", "tiny-qwen3", "tiny-gpt-oss-mxfp4"] {
        let plain = outputs(&mut generator(target, None, 512), &prompts, 24);
        for (t, drafter, parallel) in cases.iter().filter(|c| c.0 == target) {
            for k in [1, 3, 7] {
                let mut g = generator(t, Some((&fixture(drafter), k, *parallel)), 512);
                let spec = outputs(&mut g, &prompts, 24);
                for (i, (a, b)) in spec.iter().zip(&plain).enumerate() {
                    assert_eq!(a, b, "{drafter} parallel={parallel} k={k} prompt {i}");
                }
                let stats = g.engine().stats();
                assert_eq!(
                    stats.num_draft_tokens,
                    k as u64 * stats.num_drafts,
                    "every step drafts k"
                );
                assert!(stats.num_drafts > 0);
            }
        }
    }
}

/// An FP8 cache changes which tokens a model emits, but speculation still emits exactly what
/// plain decoding does on the same cache: rows keep their bits however they are batched.
#[test]
fn an_fp8_kv_cache_keeps_greedy_speculative_output_exact() {
    let prompts = &prompts()[..8];
    let fp8 = GeneratorOptions {
        kv_cache_dtype: KvCacheDtype::Fp8,
        ..Default::default()
    };
    for (target, drafter, parallel, k) in [
        ("tiny-gpt-oss-mxfp4", "tiny-gpt-oss-peagle", true, 7),
        ("tiny-gpt-oss-mxfp4", "tiny-qwen3-eagle3", false, 3),
        ("tiny-llama", "tiny-llama-peagle", true, 7),
    ] {
        let plain = outputs(&mut generator_with(target, None, &fp8), prompts, 24);
        let mut g = generator_with(target, Some((&fixture(drafter), k, parallel)), &fp8);
        assert_eq!(outputs(&mut g, prompts, 24), plain, "{target} with {drafter}, k={k}");
        assert!(g.engine().stats().num_drafts > 0);
    }
}

#[test]
fn chunked_prefill_fills_the_drafter_cache_too() {
    let prompts = prompts();
    let plain = outputs(&mut generator("tiny-llama", None, 512), &prompts, 16);
    let drafter = fixture("tiny-llama-peagle");
    let chunked = outputs(&mut generator("tiny-llama", Some((&drafter, 3, true)), 7), &prompts, 16);
    assert_eq!(chunked, plain);
}

#[test]
fn accepted_drafts_keep_greedy_output_exact() {
    let prompt = repeating_prompt();
    let plain = generator("tiny-qwen3", None, 512)
        .generate(&prompt, &greedy(40), |_| {})
        .unwrap();
    let dir = constant_drafter(203);
    for k in [1, 3, 7] {
        let mut g = generator("tiny-qwen3", Some((dir.path(), k, false)), 512);
        let out = g.generate(&prompt, &greedy(40), |_| {}).unwrap();
        assert_eq!(out.token_ids, plain.token_ids, "k={k}");
        let stats = out.spec_stats;
        assert!(
            stats.mean_acceptance_length() > 1.0 + 0.5 * k.min(3) as f64,
            "k={k}: {stats:?}"
        );
        assert!(stats.per_position_acceptance()[0] > 0.5, "{stats:?}");
    }
}

#[test]
fn seeded_sampling_with_speculation_is_reproducible() {
    let prompt = &prompts()[3];
    let params = GenerateParams {
        max_tokens: 24,
        sampling: SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.9,
            seed: Some(9),
            ..SamplingParams::default()
        },
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let drafter = fixture("tiny-llama-peagle");
    let mut g = generator("tiny-llama", Some((&drafter, 3, true)), 512);
    let a = g.generate(prompt, &params, |_| {}).unwrap().token_ids;
    let b = g.generate(prompt, &params, |_| {}).unwrap().token_ids;
    assert_eq!(a, b);
    assert_eq!(a.len(), 24);
}

#[test]
fn parallel_drafting_with_an_eagle3_head_is_refused() {
    let opts = DraftModel {
        dir: fixture("tiny-qwen3-eagle3"),
        k: Some(3),
        parallel: true,
    };
    let err = Generator::from_dir(
        &fixture("tiny-qwen3"),
        Some(&opts),
        LoadOptions::default(),
        &GeneratorOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("parallel drafting needs a mask_token_id"), "{err}");
}

fn outputs_with(g: &mut Generator, prompts: &[Vec<u32>], params: &GenerateParams) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|p| g.generate(p, params, |_| {}).unwrap().token_ids)
        .collect()
}

/// A window row counts the drafts before it as generated, so greedy speculative output under
/// penalties equals plain output under them, when drafts are mostly rejected (random
/// drafters) and when they are mostly accepted until the penalty turns the target away.
#[test]
fn penalties_keep_greedy_speculative_output_exact() {
    let penalised = GenerateParams {
        sampling: SamplingParams {
            penalties: Penalties {
                presence: 0.4,
                frequency: 0.3,
                repetition: 1.3,
                logit_bias: vec![(7, 2.0)],
            },
            ..SamplingParams::default()
        },
        ..greedy(24)
    };
    let prompts = prompts();
    let plain = outputs_with(&mut generator("tiny-llama", None, 512), &prompts, &penalised);
    assert_ne!(
        plain,
        outputs(&mut generator("tiny-llama", None, 512), &prompts, 24),
        "the penalties change the output"
    );
    assert_random_drafters_keep(&prompts, &penalised, &plain);

    // A frequency penalty ends the run of 203s part way through a window of accepted drafts.
    let prompt = repeating_prompt();
    let frequency = GenerateParams {
        sampling: SamplingParams {
            penalties: Penalties {
                frequency: 0.5,
                ..Penalties::default()
            },
            ..SamplingParams::default()
        },
        ..greedy(40)
    };
    let plain = generator("tiny-qwen3", None, 512)
        .generate(&prompt, &frequency, |_| {})
        .unwrap()
        .token_ids;
    let repeats = plain.iter().filter(|t| **t == 203).count();
    assert!((2..30).contains(&repeats), "203 repeats {repeats} times: {plain:?}");
    assert_accepted_drafts_keep(&prompt, &frequency, &plain);
}

/// Tiny-llama's output under `params` with its random P-EAGLE drafter, drafting in parallel
/// and not, at K = 3 and 7, is `plain`.
fn assert_random_drafters_keep(prompts: &[Vec<u32>], params: &GenerateParams, plain: &[Vec<u32>]) {
    let drafter = fixture("tiny-llama-peagle");
    for parallel in [true, false] {
        for k in [3, 7] {
            let mut g = generator("tiny-llama", Some((&drafter, k, parallel)), 512);
            assert_eq!(
                outputs_with(&mut g, prompts, params),
                plain,
                "parallel={parallel} k={k}"
            );
        }
    }
}

/// Tiny-qwen3's output under `params` with a drafter that always proposes 203, at K = 3 and
/// 7, is `plain`, with some drafts accepted.
fn assert_accepted_drafts_keep(prompt: &[u32], params: &GenerateParams, plain: &[u32]) {
    let dir = constant_drafter(203);
    for k in [3, 7] {
        let mut g = generator("tiny-qwen3", Some((dir.path(), k, false)), 512);
        let out = g.generate(prompt, params, |_| {}).unwrap();
        assert_eq!(out.token_ids, plain, "k={k}");
        assert!(
            out.spec_stats.per_position_acceptance()[0] > 0.0,
            "drafts were accepted"
        );
    }
}

/// Banned tokens are never emitted, and a window row bans what plain decoding would after the
/// drafts before it, so greedy speculative output under bans equals plain output under them:
/// with random drafters, and with drafts mostly accepted until a bad word turns them away.
#[test]
fn bans_keep_greedy_speculative_output_exact() {
    let with = |bans: TokenBans, max_tokens| GenerateParams {
        sampling: SamplingParams {
            bans,
            ..SamplingParams::default()
        },
        ..greedy(max_tokens)
    };
    let prompts = prompts();
    let unbanned = outputs(&mut generator("tiny-llama", None, 512), &prompts, 24);
    // Every other token of the ones the model generates unbanned, and two of its pairs.
    let mut seen: Vec<u32> = unbanned.iter().flatten().copied().collect();
    seen.sort_unstable();
    seen.dedup();
    let allowed: Vec<u32> = seen.iter().copied().step_by(2).collect();
    let pairs: Vec<Vec<u32>> = [&unbanned[0], &unbanned[1]].iter().map(|o| o[2..4].to_vec()).collect();
    let banned = with(TokenBans::new(Some(allowed.clone()), pairs.clone()), 24);
    let plain = outputs_with(&mut generator("tiny-llama", None, 512), &prompts, &banned);
    assert_ne!(plain, unbanned, "the bans change the output");
    for out in &plain {
        assert!(
            out.iter().all(|t| allowed.contains(t)),
            "{out:?} has a token not allowed"
        );
        for pair in &pairs {
            assert!(!out.windows(2).any(|w| w == &pair[..]), "{out:?} has {pair:?}");
        }
    }
    assert_random_drafters_keep(&prompts, &banned, &plain);

    // A run of 203s is cut at two each time, part way through windows of accepted drafts.
    let prompt = repeating_prompt();
    let no_triples = with(TokenBans::new(None, vec![vec![203, 203, 203]]), 40);
    let plain = generator("tiny-qwen3", None, 512)
        .generate(&prompt, &no_triples, |_| {})
        .unwrap()
        .token_ids;
    assert!(plain.windows(2).any(|w| w == [203, 203]), "{plain:?}");
    assert!(!plain.windows(3).any(|w| w == [203, 203, 203]), "{plain:?}");
    assert_accepted_drafts_keep(&prompt, &no_triples, &plain);
}

/// A grammar bans every token its text cannot go on with, and a window row bans what plain
/// decoding would after the drafts before it, so greedy speculative output under structured
/// output equals plain output under it: a JSON schema with random drafters (the text is JSON
/// the schema accepts, ended by end-of-sequence once whole), and a regex whose repeated
/// character a constant drafter proposes, accepted until the grammar turns it away.
#[test]
fn structured_output_keeps_greedy_speculative_output_exact() {
    let structured = |target: &str, spec: Spec, trigger: Vec<u32>| {
        let tokenizer = tokenizers::Tokenizer::from_file(fixture(target).join("tokenizer.json")).unwrap();
        let vocab = Arc::new(Vocabulary::from_tokenizer(&tokenizer).unwrap());
        let constraint = Arc::new(Constraint::new(spec.compile(&vocab).unwrap(), vocab.clone()));
        let structured = StructuredOutput { constraint, trigger };
        let text = move |ids: &[u32]| -> String {
            String::from_utf8(ids.iter().flat_map(|&t| vocab.bytes(t).unwrap().to_vec()).collect()).unwrap()
        };
        (structured, text)
    };
    let schema = json!({
        "type": "object",
        "properties": {
            "word": {"type": "string", "maxLength": 6},
            "n": {"type": "integer"},
            "ok": {"type": "boolean"},
            "kind": {"enum": ["a", "bb"]}
        },
        "required": ["word", "n", "ok", "kind"]
    });
    let spec = Spec::JsonSchema {
        schema,
        whitespace: None,
    };
    let (json_output, text) = structured("tiny-llama", spec, Vec::new());
    let params = GenerateParams {
        max_tokens: 160,
        ignore_eos: false,
        sampling: SamplingParams {
            structured: Some(json_output),
            ..SamplingParams::default()
        },
        ..GenerateParams::default()
    };
    let prompts = prompts();
    let plain = outputs_with(&mut generator("tiny-llama", None, 512), &prompts, &params);
    let mut whole = 0;
    for out in &plain {
        let Some((&1, body)) = out.split_last() else {
            continue;
        };
        let value: serde_json::Value =
            serde_json::from_str(&text(body)).unwrap_or_else(|e| panic!("{e}: {:?}", text(body)));
        assert!(
            value["word"].as_str().is_some_and(|w| w.chars().count() <= 6),
            "{value}"
        );
        assert!(value["n"].is_i64() && value["ok"].is_boolean(), "{value}");
        assert!(["a", "bb"].contains(&value["kind"].as_str().unwrap()), "{value}");
        whole += 1;
    }
    assert!(whole >= 10, "{whole} of {} outputs ended whole", plain.len());
    assert_random_drafters_keep(&prompts, &params, &plain);

    // Tiny-qwen3 repeats token 203 (a carriage return); the grammar cuts the run at five.
    let (cut, text) = structured("tiny-qwen3", Spec::Regex(r"\r{0,5}[a-z]+".into()), Vec::new());
    let params = GenerateParams {
        sampling: SamplingParams {
            structured: Some(cut),
            ..SamplingParams::default()
        },
        ..greedy(40)
    };
    let prompt = repeating_prompt();
    let plain = generator("tiny-qwen3", None, 512)
        .generate(&prompt, &params, |_| {})
        .unwrap()
        .token_ids;
    let out = text(&plain);
    assert!(
        out.starts_with("\r\r\r\r\r") && out[5..].bytes().all(|b| b.is_ascii_lowercase()),
        "{out:?}"
    );
    assert_accepted_drafts_keep(&prompt, &params, &plain);
}

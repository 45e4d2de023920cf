//! Automatic prefix caching: requests that share a system prompt, and the turns of a chat,
//! take the blocks earlier requests computed, and every output is what it is without the
//! cache, and so is every draft and its acceptance (the drafter's cached rows are the ones it
//! would compute): greedy and seeded sampling, with no drafter, with P-EAGLE (drafting in one
//! pass or K), with requests that do not speculate mixed in, and under KV pressure with
//! preemption. When all requests are done, the only blocks left are free cached ones.

use peagle_engine::{
    DraftModel, EngineBuilder, EngineHandle, Event, GenerateParams, Request, SamplingParams, SchedulerConfig,
    SpecStats, SubmitError,
};
use peagle_models::KvCacheDtype;
mod common;
use common::{fixture, repo};
use std::time::{Duration, Instant};

/// One finished request: its tokens, the prompt tokens it found cached, its drafts.
type Done = (Vec<u32>, usize, SpecStats);

fn engine(draft: Option<bool>, caching: bool, num_blocks: usize, chunk: usize) -> EngineHandle {
    let builder = EngineBuilder {
        draft: draft.map(|parallel| DraftModel {
            dir: fixture("tiny-llama-peagle"),
            k: Some(3),
            parallel,
        }),
        max_model_len: Some(128),
        kv_cache_blocks: Some(num_blocks),
        kv_cache_dtype: KvCacheDtype::F32,
        scheduler: SchedulerConfig {
            prefix_caching: caching,
            adaptive_k: false,
            max_num_batched_tokens: chunk,
            ..Default::default()
        },
        ..EngineBuilder::new(fixture("tiny-llama"))
    };
    EngineHandle::start(builder.build().unwrap().engine)
}

/// A 40-token system prompt, then per request a question; every third request is a later
/// turn of an earlier one's chat (its prompt, an answer, a new question).
fn prompts() -> Vec<Vec<u32>> {
    let system: Vec<u32> = (0..40).map(|j| 2 + (j * 37 % 380) as u32).collect();
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    for i in 0..12u32 {
        let question: Vec<u32> = (0..3 + i % 9).map(|j| 2 + (i * 53 + j * 29) % 380).collect();
        let mut prompt = match i % 3 {
            2 => [&prompts[i as usize - 2][..], &[7, 8, 9, 10, 11, 12, 13][..]].concat(),
            _ => system.clone(),
        };
        prompt.extend(question);
        prompts.push(prompt);
    }
    prompts
}

fn request(prompt: &[u32], i: usize, seeded: bool) -> Request {
    let sampling = match seeded {
        true => SamplingParams {
            temperature: 0.9,
            seed: Some(1000 + i as u64),
            ..SamplingParams::default()
        },
        false => SamplingParams::default(),
    };
    let params = GenerateParams {
        max_tokens: 16,
        sampling,
        ignore_eos: true,
        ..GenerateParams::default()
    };
    Request {
        // Some requests never draft: their blocks have no drafter rows.
        speculate: i % 4 != 3,
        ..Request::new(prompt.to_vec(), params)
    }
}

fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> Done {
    let mut tokens = Vec::new();
    while let Some(event) = rx.blocking_recv() {
        match event {
            Event::Tokens(t) => tokens.extend(t.iter().map(|o| o.id)),
            Event::Finished {
                cached_tokens,
                spec_stats,
                ..
            } => return (tokens, cached_tokens, spec_stats),
            Event::Failed(e) => panic!("request failed: {e}"),
            _ => {}
        }
    }
    panic!("no Finished event");
}

/// The first two requests alone (so their blocks are cached), then the rest at once.
fn run(e: &EngineHandle, seeded: bool) -> Vec<Done> {
    let prompts = prompts();
    let mut done: Vec<Done> = (0..2)
        .map(|i| collect(e.submit(request(&prompts[i], i, seeded)).unwrap()))
        .collect();
    let rest: Vec<_> = (2..prompts.len())
        .map(|i| e.submit(request(&prompts[i], i, seeded)).unwrap())
        .collect();
    done.extend(rest.into_iter().map(collect));
    let start = Instant::now();
    while e.metrics().kv_blocks_used > 0 || e.metrics().running > 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "blocks still held");
        std::thread::sleep(Duration::from_millis(10));
    }
    done
}

fn tokens(done: &[Done]) -> Vec<Vec<u32>> {
    done.iter().map(|(t, _, _)| t.clone()).collect()
}

fn drafts(done: &[Done]) -> Vec<SpecStats> {
    done.iter().map(|(_, _, s)| s.clone()).collect()
}

#[test]
fn cached_prefixes_change_no_output() {
    for draft in [None, Some(true), Some(false)] {
        for seeded in [false, true] {
            let plain = run(&engine(draft, false, 64, 2048), seeded);
            let e = engine(draft, true, 64, 2048);
            let cached = run(&e, seeded);
            let case = format!("drafter {draft:?}, seeded {seeded}");
            assert_eq!(tokens(&cached), tokens(&plain), "{case}");
            assert_eq!(drafts(&cached), drafts(&plain), "{case}");
            assert!(plain.iter().all(|(_, hit, _)| *hit == 0), "{case}");

            // Later requests found the system prompt's two full blocks of 16, and each later
            // turn its whole earlier chat where the drafter allows.
            assert!(cached[2..].iter().all(|(_, hit, _)| *hit >= 32), "{case}: {cached:?}");
            let m = e.metrics();
            let hits: usize = cached.iter().map(|(_, hit, _)| hit).sum();
            assert_eq!(m.prefix_cache_hits, hits as u64, "{case}");
            let queries: usize = prompts().iter().map(Vec::len).sum();
            assert_eq!(m.prefix_cache_queries, queries as u64, "{case}");
            assert_eq!(m.kv_blocks_used, 0, "{case}");
            assert!(m.kv_blocks_cached_free > 0, "{case}");
        }
    }
}

/// Too few blocks for the batch: eviction makes room, only ever of blocks no sequence holds,
/// and preempted requests resume from what is still cached.
#[test]
fn eviction_and_preemption_under_pressure_change_no_output() {
    for draft in [None, Some(true)] {
        let plain = run(&engine(draft, false, 64, 2048), false);
        let e = engine(draft, true, 14, 16);
        let cached = run(&e, false);
        // Drafts may differ: a preempted sequence resumes with one step without drafts.
        assert_eq!(tokens(&cached), tokens(&plain), "drafter {draft:?}");
        let m = e.metrics();
        assert!(m.preemptions_total > 0, "expected preemptions: {m:?}");
        assert!(m.prefix_cache_hits > 0);
        assert_eq!(m.kv_blocks_used, 0);
    }
}

#[test]
fn reset_forgets_the_cached_prefixes() {
    let e = engine(None, true, 64, 2048);
    let prompt = prompts()[0].clone();
    assert_eq!(collect(e.submit(request(&prompt, 0, false)).unwrap()).1, 0);
    assert_eq!(collect(e.submit(request(&prompt, 0, false)).unwrap()).1, 32);
    e.reset_prefix_cache();
    assert_eq!(collect(e.submit(request(&prompt, 0, false)).unwrap()).1, 0);
}

/// A cache salt (vLLM's) keeps requests from finding blocks cached under another salt, or
/// under none; the same salt shares them as usual, and the output is the same either way.
#[test]
fn only_requests_with_the_same_salt_share_blocks() {
    let e = engine(None, true, 64, 2048);
    let prompt = prompts()[0].clone();
    let salted = |salt: Option<&str>| {
        let request = Request {
            cache_salt: salt.map(str::to_owned),
            ..request(&prompt, 0, false)
        };
        collect(e.submit(request).unwrap())
    };
    let first = salted(None);
    assert_eq!(first.1, 0);
    let (tenant_a, tenant_a_again, tenant_b) = (salted(Some("a")), salted(Some("a")), salted(Some("b")));
    assert_eq!((tenant_a.1, tenant_a_again.1, tenant_b.1), (0, 32, 0));
    assert_eq!(salted(None).1, 32);
    for done in [tenant_a, tenant_a_again, tenant_b] {
        assert_eq!(done.0, first.0);
    }
    let empty = Request {
        cache_salt: Some(String::new()),
        ..request(&prompt, 0, false)
    };
    let refused = e.submit(empty).unwrap_err();
    assert!(
        matches!(&refused, SubmitError::Invalid(e) if e.param() == "cache_salt"),
        "{refused:?}"
    );
}

/// The demo model's trained P-EAGLE and EAGLE-3 drafters accept drafts, so a drafter row
/// taken from the cache that differed from the one it would compute would show in the
/// acceptance. The cases where a cached block's drafter rows do not hold: a prompt that leaves
/// an earlier one exactly at a block boundary (the last row saw another next token), and a
/// prompt first run without speculation (no drafter rows at all).
/// With speculation suspended (k = 0, which the adaptive k picks on a busy or slow host), a
/// finished request's drafter still writes its rows, so its blocks serve a drafting request.
#[test]
fn blocks_computed_while_speculation_is_suspended_serve_drafting_requests() {
    let builder = EngineBuilder {
        draft: Some(DraftModel {
            dir: fixture("tiny-llama-peagle"),
            k: Some(3),
            parallel: true,
        }),
        max_model_len: Some(128),
        kv_cache_dtype: KvCacheDtype::F32,
        scheduler: SchedulerConfig {
            // Speculation off at any batch size: k = 0 every step.
            max_speculative_batch: 0,
            ..Default::default()
        },
        ..EngineBuilder::new(fixture("tiny-llama"))
    };
    let e = EngineHandle::start(builder.build().unwrap().engine);
    let prompt = &prompts()[0];
    let (first, cached_first, _) = collect(e.submit(request(prompt, 0, false)).unwrap());
    let (again, cached_again, _) = collect(e.submit(request(prompt, 0, false)).unwrap());
    assert_eq!(cached_first, 0);
    // 43 prompt tokens: two whole blocks of 16 can be reused (the last token is recomputed).
    assert_eq!(cached_again, 32);
    assert_eq!(first, again);
}

#[test]
fn cache_hits_draft_and_accept_as_misses_do() {
    let tokenizer = tokenizers::Tokenizer::from_file(repo("models/pystdlib-12l/tokenizer.json")).unwrap();
    let text = std::fs::read_to_string(repo("models/pystdlib-12l/eval_prompts.jsonl")).unwrap();
    let eval: Vec<Vec<u32>> = text
        .lines()
        .take(3)
        .map(|l| {
            let prompt = serde_json::from_str::<serde_json::Value>(l).unwrap()["prompt"]
                .as_str()
                .unwrap()
                .to_string();
            tokenizer.encode(prompt, true).unwrap().get_ids().to_vec()
        })
        .collect();
    let (a, b, c) = (&eval[0], &eval[1], &eval[2]);
    assert!(a.len() > 40 && b.len() > 16, "eval prompts too short");
    let a_then_b = [&a[..32], &b[..]].concat();
    // (prompt, speculate)
    let requests = [
        (a.clone(), true),
        (a_then_b.clone(), true),
        (c.clone(), false),
        (c.clone(), true),
        (a.clone(), true),
        (a_then_b, true),
    ];
    for (drafter, parallel) in [("pystdlib-12l-peagle", true), ("pystdlib-12l-eagle3", false)] {
        let run = |caching: bool| {
            let builder = EngineBuilder {
                draft: Some(DraftModel {
                    dir: repo("models").join(drafter),
                    k: Some(3),
                    parallel,
                }),
                scheduler: SchedulerConfig {
                    prefix_caching: caching,
                    adaptive_k: false,
                    ..Default::default()
                },
                ..EngineBuilder::new(repo("models/pystdlib-12l"))
            };
            let e = EngineHandle::start(builder.build().unwrap().engine);
            requests
                .iter()
                .map(|(p, speculate)| {
                    let request = Request {
                        speculate: *speculate,
                        ..request(p, 0, false)
                    };
                    collect(e.submit(request).unwrap())
                })
                .collect::<Vec<Done>>()
        };
        let (plain, cached) = (run(false), run(true));
        assert_eq!(tokens(&cached), tokens(&plain), "{drafter}");
        assert_eq!(drafts(&cached), drafts(&plain), "{drafter}");
        let accepted: u64 = cached.iter().map(|(_, _, s)| s.num_accepted_tokens).sum();
        assert!(accepted > 0, "{drafter} accepted nothing");
        let hits: Vec<usize> = cached.iter().map(|(_, hit, _)| *hit).collect();
        // a_then_b keeps only a's first block, and again when run again: its own third block
        // follows a's second, whose last drafter row saw a's next token; c with a drafter
        // finds no drafter rows.
        assert_eq!(&hits[..4], [0, 16, 0, 0], "{drafter}");
        assert!(hits[4] > 0, "{drafter}");
        assert_eq!(hits[5], 16, "{drafter}");
    }
}

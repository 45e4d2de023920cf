//! Everything a request can ask for, mixed in one engine at once: greedy and seeded sampling
//! (temperature, top-k, top-p, min-p), penalties and logit bias, `min_tokens`, stop tokens,
//! bans, a grammar, log-probabilities of the output and of the prompt, cache salts, requests
//! that opt out of speculation, and clients that leave early. Under P-EAGLE and K-pass drafting,
//! with prefix caching, chunked prefill and too few KV blocks (so preemption), every request
//! that stays gets what it gets alone on a plain engine, to the bit: its tokens, their
//! log-probabilities, its prompt's and its finish reason. When all are done no block is held.
//! Two workloads: tiny-llama with its random drafter, whose drafts are almost all rejected, and
//! tiny-qwen3 with a drafter that always proposes the token the target repeats, so that drafts
//! are accepted until a penalty, a ban, a stop token, the grammar or a draw turns them away.

use peagle_engine::{
    DraftModel, EngineBuilder, EngineHandle, Event, FinishReason, GenerateParams, Penalties, Request, SamplingParams,
    SchedulerConfig, StructuredOutput, TokenBans, TokenOutput,
};
use peagle_grammar::{Constraint, Spec, Vocabulary};
use peagle_models::KvCacheDtype;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
mod common;
use common::{constant_drafter, fixture, repeating_prompt};

/// The fixtures' end-of-sequence token.
const EOS: u32 = 1;
/// The token tiny-qwen3 repeats after `repeating_prompt` (a carriage return).
const REPEATED: u32 = 203;

/// What one request got: its prompt's log-probabilities, its tokens and how it ended.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    prompt_logprobs: Vec<TokenOutput>,
    tokens: Vec<TokenOutput>,
    reason: FinishReason,
}

/// Seeded draws of the test cases, so that a failure names a case that reruns.
struct Cases(StdRng);

impl Cases {
    fn new(seed: u64) -> Self {
        Self(StdRng::seed_from_u64(seed))
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A value in [lo, hi) on a grid of 1/64.
    fn between(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.below(64) as f32 / 64.0
    }

    /// A token of the fixtures' 384, now and then `favoured`.
    fn token(&mut self, favoured: Option<u32>) -> u32 {
        match favoured {
            Some(t) if self.chance(25) => t,
            _ => 2 + self.below(380) as u32,
        }
    }
}

/// What a workload's requests are made of.
struct Workload {
    target: &'static str,
    /// The start of about half the prompts (for the prefix cache).
    shared_prefix: Vec<u32>,
    /// A regex the text of some requests must follow.
    regex: &'static str,
    /// A token that stop tokens, biases, bans and allowed lists name more often than others.
    favoured: Option<u32>,
}

/// A constraint over `target`'s vocabulary.
fn grammar(target: &str, spec: Spec) -> StructuredOutput {
    let tokenizer = tokenizers::Tokenizer::from_file(fixture(target).join("tokenizer.json")).unwrap();
    let vocab = Arc::new(Vocabulary::from_tokenizer(&tokenizer).unwrap());
    let constraint = Arc::new(Constraint::new(spec.compile(&vocab).unwrap(), vocab));
    StructuredOutput {
        constraint,
        trigger: Vec::new(),
    }
}

/// `n` requests of `w`, each with a random choice of every option, under one of two salts or
/// none.
fn requests(w: &Workload, n: usize, seed: u64) -> Vec<Request> {
    let mut c = Cases::new(seed);
    let favoured = w.favoured;
    let regex = grammar(w.target, Spec::Regex(w.regex.into()));
    (0..n)
        .map(|_| {
            let mut prompt = if c.chance(50) {
                w.shared_prefix.clone()
            } else {
                Vec::new()
            };
            prompt.extend((0..1 + c.below(24)).map(|_| c.token(favoured)));
            let mut sampling = SamplingParams::default();
            if c.chance(60) {
                sampling.temperature = c.between(0.5, 1.5);
                sampling.seed = Some(c.below(1 << 20));
                sampling.top_k = [0, 5, 40][c.below(3) as usize];
                sampling.top_p = [1.0, 0.9, 0.5][c.below(3) as usize];
                sampling.min_p = [0.0, 0.05][c.below(2) as usize];
            }
            if c.chance(40) {
                sampling.penalties = Penalties {
                    presence: c.between(-1.0, 1.0),
                    frequency: c.between(-1.0, 1.0),
                    repetition: c.between(0.8, 1.3),
                    logit_bias: (0..c.below(4))
                        .map(|_| (c.token(favoured), c.between(-5.0, 5.0)))
                        .collect(),
                };
            }
            if c.chance(25) {
                let mut allowed: Vec<u32> = (0..60).map(|_| c.token(favoured)).collect();
                allowed.extend([EOS]);
                allowed.sort_unstable();
                allowed.dedup();
                sampling.bans = TokenBans {
                    allowed: Some(allowed),
                    bad_words: Vec::new(),
                };
            } else if c.chance(30) {
                let bad_words = (0..1 + c.below(3))
                    .map(|_| (0..1 + c.below(2)).map(|_| c.token(favoured)).collect())
                    .collect();
                sampling.bans = TokenBans {
                    allowed: None,
                    bad_words,
                };
            }
            if sampling.bans.allowed.is_none() && c.chance(15) {
                sampling.structured = Some(regex.clone());
            }
            let stop_token_ids: Vec<u32> = (0..c.below(3)).map(|_| c.token(favoured)).collect();
            // Random weights rarely choose one given token: a bias makes some requests end on
            // end-of-sequence or on a stop token.
            for end in [EOS].iter().chain(stop_token_ids.first()) {
                if c.chance(20) {
                    sampling.penalties.logit_bias.push((*end, 8.0));
                }
            }
            let params = GenerateParams {
                max_tokens: 1 + c.below(24) as usize,
                sampling,
                ignore_eos: c.chance(50),
                min_tokens: c.below(4) as usize,
                stop_token_ids,
            };
            Request {
                speculate: c.chance(80),
                logprobs: c.chance(50).then(|| c.below(4) as usize),
                prompt_logprobs: c.chance(20).then(|| c.below(3) as usize),
                cache_salt: [None, None, Some("a".to_owned())][c.below(3) as usize].clone(),
                ..Request::new(prompt, params)
            }
        })
        .collect()
}

/// A drafter (its directory, K, and whether it drafts in one pass) or none, the KV blocks and
/// the most rows a step.
type Setup<'a> = (Option<(&'a Path, usize, bool)>, usize, usize);

/// An engine on `target` as `setup` says, with prefix caching or not.
fn engine(target: &str, (draft, num_blocks, budget): Setup, prefix_caching: bool) -> EngineHandle {
    let scheduler = SchedulerConfig {
        max_num_batched_tokens: budget,
        // Every step drafts: the adaptive k could turn the random drafters off.
        adaptive_k: false,
        prefix_caching,
        ..Default::default()
    };
    let builder = EngineBuilder {
        draft: draft.map(|(dir, k, parallel)| DraftModel {
            dir: dir.to_owned(),
            k: Some(k),
            parallel,
        }),
        max_model_len: Some(128),
        kv_cache_blocks: Some(num_blocks),
        kv_cache_dtype: KvCacheDtype::F32,
        scheduler,
        ..EngineBuilder::new(fixture(target))
    };
    EngineHandle::start(builder.build().unwrap().engine)
}

/// Reads a request's events to its end, or, with `leave`, drops them after its first tokens
/// (the client gone).
fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>, leave: bool) -> Option<Outcome> {
    let mut prompt_logprobs = Vec::new();
    let mut tokens = Vec::new();
    while let Some(event) = rx.blocking_recv() {
        match event {
            Event::Scheduled(_) => {}
            Event::PromptLogprobs(p) => prompt_logprobs.extend(p),
            Event::Tokens(t) if leave => {
                assert!(!t.is_empty());
                return None;
            }
            Event::Tokens(t) => tokens.extend(t),
            Event::Finished {
                reason,
                completion_tokens,
                ..
            } => {
                assert_eq!(completion_tokens, tokens.len());
                return Some(Outcome {
                    prompt_logprobs,
                    tokens,
                    reason,
                });
            }
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
    panic!("the events ended without Finished");
}

/// All `requests` at once on `e`, each read on a thread of its own; those `leaving` leave.
fn run_together(e: &EngineHandle, requests: &[Request], leaving: impl Fn(usize) -> bool) -> Vec<Option<Outcome>> {
    let receivers: Vec<_> = requests.iter().map(|r| e.submit(r.clone()).unwrap()).collect();
    std::thread::scope(|s| {
        let readers: Vec<_> = receivers
            .into_iter()
            .enumerate()
            .map(|(i, rx)| {
                let leave = leaving(i);
                s.spawn(move || collect(rx, leave))
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

fn wait_for_idle(e: &EngineHandle, case: &str) {
    let start = Instant::now();
    while e.metrics().kv_blocks_used > 0 || e.metrics().running > 0 || e.metrics().waiting > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{case}: blocks still held: {:?}",
            e.metrics()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `requests` alone on a plain engine with no prefix cache, then all at once under each setup
/// with prefix caching, every seventh client leaving after its first tokens; `drafts_accepted`:
/// whether the drafters' drafts must be accepted now and then.
fn assert_mixed_batches_match_alone(target: &str, requests: &[Request], setups: &[Setup], drafts_accepted: bool) {
    let leaves = |i: usize| i % 7 == 3;
    // A leaving client's request runs to the context's end, so that it is still running when
    // its client, which reads its events on a thread of its own, leaves.
    let requests: Vec<Request> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| match leaves(i) {
            true => Request {
                params: GenerateParams {
                    max_tokens: 128,
                    ignore_eos: true,
                    stop_token_ids: Vec::new(),
                    ..r.params.clone()
                },
                ..r.clone()
            },
            false => r.clone(),
        })
        .collect();
    let alone_engine = engine(target, (None, 64, 2048), false);
    let alone: Vec<Outcome> = requests
        .iter()
        .map(|r| collect(alone_engine.submit(r.clone()).unwrap(), false).unwrap())
        .collect();
    // The cases must reach what they are meant to test.
    assert!(alone.iter().any(|o| o.reason == FinishReason::Stop));
    assert!(alone.iter().any(|o| matches!(o.reason, FinishReason::StopToken(_))));
    assert!(alone.iter().any(|o| o.reason == FinishReason::Length));
    assert!(alone.iter().any(|o| !o.prompt_logprobs.is_empty()));
    assert!(alone
        .iter()
        .any(|o| o.tokens.iter().any(|t| !t.top_logprobs.is_empty())));

    for &setup in setups {
        let (draft, blocks, budget) = setup;
        let case = format!("{target}, drafter {draft:?}, {blocks} blocks, {budget} rows a step");
        let e = engine(target, setup, true);
        let together = run_together(&e, &requests, leaves);
        for (i, (got, want)) in together.iter().zip(&alone).enumerate() {
            if let Some(got) = got {
                assert_eq!(got, want, "{case}: request {i}: {:?}", requests[i].params);
            }
        }
        wait_for_idle(&e, &case);
        let m = e.metrics();
        if blocks < 16 {
            assert!(m.preemptions_total > 0, "{case}: expected preemptions: {m:?}");
        }
        if draft.is_some() {
            assert!(m.spec.num_drafts > 0, "{case}: nothing drafted");
            assert!(
                !drafts_accepted || m.spec.num_accepted_tokens > 0,
                "{case}: {:?}",
                m.spec
            );
        }
        assert!(m.prefix_cache_hits > 0, "{case}: no prefix was reused");
        assert!(m.requests_aborted > 0, "{case}: no client left: {m:?}");
    }
}

#[test]
fn a_mixed_batch_gets_what_each_request_gets_alone() {
    let mut c = Cases::new(7);
    let workload = Workload {
        target: "tiny-llama",
        shared_prefix: (0..40).map(|_| c.token(None)).collect(),
        regex: "[a-z ]{2,30}",
        favoured: None,
    };
    let requests = requests(&workload, 80, 20261203);
    let drafter = fixture("tiny-llama-peagle");
    let setups = [
        (Some((drafter.as_path(), 3, true)), 10, 16),
        (Some((drafter.as_path(), 3, false)), 64, 32),
        (Some((drafter.as_path(), 7, true)), 64, 2048),
        (None, 10, 8),
    ];
    assert_mixed_batches_match_alone(workload.target, &requests, &setups, false);
}

#[test]
fn a_mixed_batch_with_accepted_drafts_gets_what_each_request_gets_alone() {
    let workload = Workload {
        target: "tiny-qwen3",
        shared_prefix: repeating_prompt(),
        regex: "\\r{0,5}[a-z]+",
        favoured: Some(REPEATED),
    };
    let requests = requests(&workload, 80, 5);
    let drafter = constant_drafter(REPEATED as i64);
    let setups = [
        (Some((drafter.path(), 3, false)), 10, 16),
        (Some((drafter.path(), 7, false)), 64, 2048),
    ];
    assert_mixed_batches_match_alone(workload.target, &requests, &setups, true);
}

//! The serving engine under concurrency: every request gets exactly what it gets alone,
//! through preemption, speculation on, off and suspended, and cancellation frees its blocks.

use peagle_engine::{
    DraftModel, Engine, EngineBuilder, EngineHandle, Event, FinishReason, GenerateError, GenerateParams, Generator,
    GeneratorOptions, InvalidRequest, Request, SamplingParams, SchedulerConfig, SubmitError,
};
use peagle_models::{KvCacheDtype, LoadOptions};
mod common;
use common::fixture;
use std::time::{Duration, Instant};

/// The context length of `engine`'s model.
const MAX_MODEL_LEN: usize = 256;

fn engine(
    draft: Option<(&str, usize, bool)>,
    num_blocks: usize,
    scheduler: SchedulerConfig,
    max_waiting: usize,
) -> EngineHandle {
    let scheduler = SchedulerConfig {
        max_waiting,
        ..scheduler
    };
    EngineHandle::start(build(draft, num_blocks, MAX_MODEL_LEN, scheduler).unwrap())
}

fn build(
    draft: Option<(&str, usize, bool)>,
    num_blocks: usize,
    max_model_len: usize,
    scheduler: SchedulerConfig,
) -> Result<Engine, GenerateError> {
    let builder = EngineBuilder {
        draft: draft.map(|(dir, k, parallel)| DraftModel {
            dir: fixture(dir),
            k: Some(k),
            parallel,
        }),
        max_model_len: Some(max_model_len),
        kv_cache_blocks: Some(num_blocks),
        kv_cache_dtype: KvCacheDtype::F32,
        scheduler,
        ..EngineBuilder::new(fixture("tiny-llama"))
    };
    builder.build().map(|built| built.engine)
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> Request {
    let params = GenerateParams {
        max_tokens,
        ignore_eos: true,
        ..GenerateParams::default()
    };
    Request::new(prompt, params)
}

/// Collects a request's tokens until it finishes, checking that it was scheduled once, first
/// (preempted and readmitted or not).
fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> (Vec<u32>, FinishReason) {
    let mut tokens = Vec::new();
    let mut scheduled = false;
    while let Some(event) = rx.blocking_recv() {
        assert!(
            scheduled || matches!(event, Event::Scheduled(_)),
            "an event before Scheduled"
        );
        match event {
            Event::Scheduled(_) => {
                assert!(!scheduled, "scheduled twice");
                scheduled = true;
            }
            Event::Tokens(t) => tokens.extend(t.iter().map(|o| o.id)),
            Event::PromptLogprobs(_) => panic!("prompt log-probabilities were not asked for"),
            Event::Finished {
                reason,
                completion_tokens,
                ..
            } => {
                assert_eq!(completion_tokens, tokens.len());
                return (tokens, reason);
            }
            Event::Failed(e) => panic!("request failed: {e}"),
        }
    }
    panic!("event channel closed without Finished");
}

fn prompts(n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..3 + (i * 7) % 29)
                .map(|j| 2 + ((i * 31 + j * 17) % 380) as u32)
                .collect()
        })
        .collect()
}

fn alone(prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Vec<u32>> {
    let mut g = Generator::from_dir(
        &fixture("tiny-llama"),
        None,
        LoadOptions::default(),
        &GeneratorOptions::default(),
    )
    .unwrap();
    let params = GenerateParams {
        max_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..GenerateParams::default()
    };
    prompts
        .iter()
        .map(|p| g.generate(p, &params, |_| {}).unwrap().token_ids)
        .collect()
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn concurrent_requests_equal_their_solo_runs() {
    let prompts = prompts(20);
    let expected = alone(&prompts, 20);
    // (drafter, K, parallel), the number of KV blocks, the context length and the step's
    // token budget.
    type Setup<'a> = (Option<(&'a str, usize, bool)>, usize, usize, usize);
    let setups: [Setup; 4] = [
        (None, 64, MAX_MODEL_LEN, 2048),
        (Some(("tiny-llama-peagle", 3, true)), 64, MAX_MODEL_LEN, 2048),
        (Some(("tiny-llama-peagle", 3, false)), 64, MAX_MODEL_LEN, 2048),
        // Too few blocks for all 20 at once (each needs up to 4), and prompts prefilled in
        // chunks of 16: the scheduler must preempt and recompute, some prompts halfway.
        (Some(("tiny-llama-peagle", 3, true)), 12, 64, 16),
    ];
    for (draft, blocks, max_model_len, max_num_batched_tokens) in setups {
        // Every step drafts: the random fixture drafters would rightly lose the adaptive k's
        // warm-up, and exactness is what is tested here.
        let scheduler = SchedulerConfig {
            adaptive_k: false,
            max_num_batched_tokens,
            ..Default::default()
        };
        let e = EngineHandle::start(build(draft, blocks, max_model_len, scheduler).unwrap());
        let receivers: Vec<_> = prompts
            .iter()
            .map(|p| e.submit(request(p.clone(), 20)).unwrap())
            .collect();
        let got: Vec<Vec<u32>> = receivers.into_iter().map(|rx| collect(rx).0).collect();
        assert_eq!(got, expected, "{draft:?} with {blocks} blocks");
        wait_until("blocks to be freed", || {
            e.metrics().kv_blocks_used == 0 && e.metrics().running == 0
        });
        let m = e.metrics();
        assert_eq!(m.generation_tokens_total, 20 * 20);
        // Each prompt counts once, however often it was preempted and recomputed.
        let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
        assert_eq!(m.prompt_tokens_total, prompt_tokens as u64);
        if blocks == 12 {
            assert!(m.preemptions_total > 0, "expected preemptions: {m:?}");
        }
        if draft.is_some() {
            assert!(m.spec.num_drafts > 0);
        }
    }
}

/// A cache that cannot hold one sequence of the full context length is refused up front: that
/// sequence could only preempt itself and start over, forever.
#[test]
fn a_cache_too_small_for_one_full_sequence_is_refused() {
    // 256 tokens, then a window of 3 drafts and 2 mask slots: 17 blocks of 16.
    let small = |draft, blocks| build(draft, blocks, MAX_MODEL_LEN, SchedulerConfig::default());
    let err = small(Some(("tiny-llama-peagle", 3, true)), 16)
        .err()
        .expect("16 blocks are too few");
    assert!(
        err.to_string()
            .contains("16 blocks of 16 tokens cannot hold one sequence of the maximum length (256 tokens, 3 drafts): that takes 17 blocks"),
        "{err}"
    );
    assert!(small(Some(("tiny-llama-peagle", 3, true)), 17).is_ok());
    assert!(small(None, 16).is_ok());
}

#[test]
fn speculation_is_suspended_under_load_and_exactness_holds() {
    let prompts = prompts(6);
    let expected = alone(&prompts, 16);
    let scheduler = SchedulerConfig {
        max_speculative_batch: 2,
        ..Default::default()
    };
    let e = engine(Some(("tiny-llama-peagle", 3, true)), 64, scheduler, 256);
    let receivers: Vec<_> = prompts
        .iter()
        .map(|p| e.submit(request(p.clone(), 16)).unwrap())
        .collect();
    let got: Vec<Vec<u32>> = receivers.into_iter().map(|rx| collect(rx).0).collect();
    assert_eq!(got, expected);
    let drafts = e.metrics().spec.num_drafts;
    // Alone, each request would verify drafts at every one of its 15 decode steps.
    assert!(
        drafts < 6 * 15,
        "speculation should have been suspended for part of the run: {drafts} drafts"
    );
}

#[test]
fn a_request_can_opt_out_of_speculation() {
    let e = engine(
        Some(("tiny-llama-peagle", 3, true)),
        64,
        SchedulerConfig::default(),
        256,
    );
    let mut r = request(prompts(1)[0].clone(), 12);
    r.speculate = false;
    let (tokens, _) = collect(e.submit(r).unwrap());
    assert_eq!(tokens, alone(&prompts(1), 12)[0]);
    assert_eq!(e.metrics().spec.num_drafts, 0);
}

#[test]
fn cancelling_frees_the_blocks() {
    let e = engine(None, 64, SchedulerConfig::default(), 256);
    let mut rx = e.submit(request(prompts(1)[0].clone(), 200)).unwrap();
    assert!(matches!(rx.blocking_recv(), Some(Event::Scheduled(_))));
    assert!(matches!(rx.blocking_recv(), Some(Event::Tokens(_))));
    wait_until("blocks in use", || e.metrics().kv_blocks_used > 0);
    drop(rx);
    wait_until("cancellation", || {
        e.metrics().kv_blocks_used == 0 && e.metrics().running == 0
    });
    assert_eq!(e.metrics().requests_aborted, 1);
}

#[test]
fn logprobs_describe_the_target_distribution() {
    let e = engine(
        Some(("tiny-llama-peagle", 3, true)),
        64,
        SchedulerConfig::default(),
        256,
    );
    let mut r = request(prompts(2)[1].clone(), 8);
    r.logprobs = Some(3);
    let mut rx = e.submit(r).unwrap();
    assert!(matches!(rx.blocking_recv(), Some(Event::Scheduled(_))));
    let mut seen = 0;
    while let Some(Event::Tokens(outs)) = rx.blocking_recv() {
        for o in outs {
            seen += 1;
            assert_eq!(o.top_logprobs.len(), 3);
            // Greedy: the chosen token is the most likely one.
            assert_eq!(o.top_logprobs[0].0, o.id);
            assert_eq!(o.logprob, Some(o.top_logprobs[0].1));
            assert!(o.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));
            assert!(o.top_logprobs.iter().all(|(_, lp)| *lp <= 0.0));
        }
    }
    assert_eq!(seen, 8);
}

/// Prompt log-probabilities cover every prompt token once, in order, before the first
/// generated token, and do not depend on how the prompt was split into prefill chunks.
#[test]
fn prompt_logprobs_are_the_same_whatever_the_chunking() {
    let prompt: Vec<u32> = (0..37).map(|i| (i * 7 % 50 + 3) as u32).collect();
    let scored = |max_num_batched_tokens| {
        let scheduler = SchedulerConfig {
            max_num_batched_tokens,
            ..Default::default()
        };
        let e = engine(Some(("tiny-llama-peagle", 3, true)), 64, scheduler, 256);
        let mut r = request(prompt.clone(), 4);
        r.prompt_logprobs = Some(2);
        let mut rx = e.submit(r).unwrap();
        let mut entries = Vec::new();
        while let Some(event) = rx.blocking_recv() {
            match event {
                Event::Scheduled(_) => assert!(entries.is_empty(), "scheduled after scoring"),
                Event::PromptLogprobs(outs) => entries.extend(outs),
                Event::Tokens(_) => assert_eq!(entries.len(), prompt.len(), "the prompt comes first"),
                Event::Finished { .. } => break,
                Event::Failed(e) => panic!("{e}"),
            }
        }
        entries
    };
    let whole = scored(2048);
    let chunked = scored(8);
    assert_eq!(whole.iter().map(|o| o.id).collect::<Vec<_>>(), prompt);
    assert_eq!((whole[0].logprob, whole[0].top_logprobs.len()), (None, 0));
    for (a, b) in whole.iter().zip(&chunked).skip(1) {
        assert_eq!(a.id, b.id);
        assert!((a.logprob.unwrap() - b.logprob.unwrap()).abs() < 1e-4, "{a:?} vs {b:?}");
        assert_eq!(a.top_logprobs.len(), 2);
        assert!(a.logprob.unwrap() <= a.top_logprobs[0].1 + 1e-6);
    }
}

#[test]
fn bad_requests_are_refused() {
    let e = engine(None, 64, SchedulerConfig::default(), 256);
    let err = |r| e.submit(r).err().unwrap();
    assert_eq!(
        err(request(vec![], 4)),
        SubmitError::Invalid(InvalidRequest::EmptyPrompt)
    );
    assert_eq!(err(request(vec![5], 0)), SubmitError::Invalid(InvalidRequest::NoTokens));
    let long = err(request(vec![5; 300], 4));
    assert!(
        long.to_string().contains("300 tokens but the model's context is 256"),
        "{long}"
    );
    let outside = |param| InvalidRequest::OutsideVocabulary {
        param,
        token: 384,
        vocab_size: 384,
    };
    assert_eq!(err(request(vec![5, 384], 4)), SubmitError::Invalid(outside("prompt")));
    let mut stop = request(vec![5], 4);
    stop.params.stop_token_ids = vec![7, 384];
    assert_eq!(err(stop), SubmitError::Invalid(outside("stop_token_ids")));
    let mut hot = request(vec![5], 4);
    hot.params.sampling.temperature = -1.0;
    let hot = err(hot);
    assert!(
        matches!(&hot, SubmitError::Invalid(e) if e.param() == "temperature"),
        "{hot}"
    );
}

#[test]
fn a_waiting_limit_of_zero_is_refused() {
    let err = build(
        None,
        64,
        MAX_MODEL_LEN,
        SchedulerConfig {
            max_waiting: 0,
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert_eq!(err.to_string(), "the waiting-request limit must be at least 1");
}

/// The queue limit holds while the engine steps: a request it has not taken from its inbox yet
/// still counts as waiting. The engine used to publish only its own queue after each step, so
/// for a moment the latest requests did not count, and more got in.
#[test]
fn the_queue_limit_holds_against_a_stream_of_submissions() {
    let scheduler = SchedulerConfig {
        max_num_seqs: 1,
        ..Default::default()
    };
    let e = engine(None, 64, scheduler, 3);
    let mut running = e.submit(request(prompts(1)[0].clone(), MAX_MODEL_LEN - 16)).unwrap();
    wait_until("the long request to run", || e.metrics().running == 1);
    let started = Instant::now();
    let mut accepted = Vec::new();
    for _ in 0..2000 {
        match e.submit(request(prompts(1)[0].clone(), 1)) {
            Ok(rx) => accepted.push(rx),
            Err(SubmitError::QueueFull { .. }) => {}
            Err(other) => panic!("{other}"),
        }
    }
    let submitting = started.elapsed();
    let still_running = std::iter::from_fn(|| running.try_recv().ok()).all(|e| !matches!(e, Event::Finished { .. }));
    assert!(
        still_running,
        "the long request ended within the {submitting:?} of submissions"
    );
    // Only the long request ran while the submissions came: the queue held exactly 3.
    assert_eq!(accepted.len(), 3);
}

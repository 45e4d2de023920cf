//! The scheduler on its own: a fake step stands in for the model, committing one token per
//! decode and caching each prefill chunk, so admission, chunking, preemption and block
//! accounting are checked without a forward pass.

use super::*;
use crate::request::{GenerateParams, TokenOutput};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

const BLOCK: usize = 4;

fn scheduler(num_blocks: usize, max_num_seqs: usize, max_num_batched_tokens: usize) -> Scheduler {
    let config = SchedulerConfig {
        max_num_seqs,
        max_num_batched_tokens,
        ..SchedulerConfig::default()
    };
    Scheduler::new(config, BlockManager::new(num_blocks, BLOCK), 0, 0)
}

fn add(s: &mut Scheduler, prompt_len: usize, max_tokens: usize) -> UnboundedReceiver<Event> {
    let (events, rx) = unbounded_channel();
    let params = GenerateParams {
        max_tokens,
        ignore_eos: true,
        ..GenerateParams::default()
    };
    s.add(Entry {
        seq: Sequence::new((1..=prompt_len as u32).collect(), params),
        events,
        scheduled: false,
    });
    rx
}

/// What a model step would do to the sequences: cache each prefill chunk (sampling a token
/// when it ends the prompt) and commit one token per decode.
fn fake_step(s: &mut Scheduler, schedule: &Schedule) {
    for (seq, work) in s.work(schedule) {
        let (start, rows) = work.span(seq);
        seq.num_cached = start + rows;
        if work == Work::Decode || seq.num_cached == seq.len() {
            let token = TokenOutput::bare(7);
            seq.commit(&[token], &[], usize::MAX);
            seq.num_cached = seq.len() - 1;
        }
    }
    s.finish_step(schedule);
}

fn tokens(rx: &mut UnboundedReceiver<Event>) -> (usize, Option<FinishReason>) {
    let mut n = 0;
    let mut finish = None;
    while let Ok(event) = rx.try_recv() {
        match event {
            Event::Tokens(t) => n += t.len(),
            Event::Finished { reason, .. } => finish = Some(reason),
            _ => {}
        }
    }
    (n, finish)
}

#[test]
fn admission_follows_the_sequence_limit_and_the_token_budget() {
    let mut s = scheduler(64, 2, 10);
    let _rx: Vec<_> = (0..3).map(|_| add(&mut s, 6, 4)).collect();
    let schedule = s.schedule();
    // The first prompt takes 6 rows, the second the 4 left of the budget; the third waits
    // for a free sequence slot.
    assert_eq!(schedule, vec![(0, Work::Prefill(10)), (1, Work::Prefill(4))]);
    assert_eq!(s.num_running(), 2);
    fake_step(&mut s, &schedule);
    let schedule = s.schedule();
    assert_eq!(
        schedule,
        vec![(0, Work::Decode), (1, Work::Prefill(9))],
        "the chunked prompt goes on"
    );
}

#[test]
fn blocks_grow_for_the_step_and_roll_back_to_the_committed_tokens() {
    let mut s = Scheduler::new(SchedulerConfig::default(), BlockManager::new(16, BLOCK), 3, 2);
    let _rx = add(&mut s, 5, 8);
    let schedule = s.schedule();
    // 5 prompt rows and the drafter's 2 positions of look-ahead: 7 tokens, 2 blocks.
    assert_eq!(s.blocks().num_used(), 2);
    fake_step(&mut s, &schedule);
    // 6 committed tokens keep 2 blocks.
    assert_eq!(s.blocks().num_used(), 2);
    s.running[0].seq.drafts = vec![9, 9, 9];
    let schedule = s.schedule();
    // A window of 4 rows from position 5, then 2 more: 11 tokens, 3 blocks.
    assert_eq!((schedule.clone(), s.blocks().num_used()), (vec![(0, Work::Decode)], 3));
    s.running[0].seq.drafts.clear();
    fake_step(&mut s, &schedule);
    assert_eq!(s.blocks().num_used(), 2, "the rejected drafts' block is freed");
}

#[test]
fn the_newest_sequence_is_preempted_when_blocks_run_out_and_resumes() {
    // 4 blocks of 4: the first sequence decodes to 12 tokens (3 blocks), the second to 7 (2).
    let mut s = scheduler(4, 4, 64);
    let mut first = add(&mut s, 7, 5);
    let mut second = add(&mut s, 3, 4);
    let schedule = s.schedule();
    assert_eq!(schedule.len(), 2);
    let mut preempted = false;
    for _ in 0..20 {
        let schedule = s.schedule();
        preempted |= s.counters.preemptions > 0;
        if schedule.is_empty() {
            break;
        }
        fake_step(&mut s, &schedule);
    }
    assert!(preempted, "two sequences cannot both reach their length in 4 blocks");
    assert_eq!(tokens(&mut first), (5, Some(FinishReason::Length)));
    assert_eq!(tokens(&mut second), (4, Some(FinishReason::Length)));
    assert!(s.is_idle());
    assert_eq!(s.blocks().num_used(), 0, "every block is back");
}

#[test]
fn a_request_is_scheduled_once_even_when_preempted() {
    let mut s = scheduler(4, 4, 64);
    let mut rxs = vec![add(&mut s, 7, 6), add(&mut s, 6, 6)];
    while !s.is_idle() {
        let schedule = s.schedule();
        fake_step(&mut s, &schedule);
    }
    for rx in &mut rxs {
        let mut scheduled = 0;
        while let Ok(event) = rx.try_recv() {
            scheduled += matches!(event, Event::Scheduled(_)) as usize;
        }
        assert_eq!(scheduled, 1);
    }
    assert!(s.counters.preemptions > 0);
}

#[test]
fn cancelled_requests_free_their_blocks() {
    let mut s = scheduler(16, 4, 64);
    let running = add(&mut s, 9, 50);
    let schedule = s.schedule();
    fake_step(&mut s, &schedule);
    let waiting = add(&mut s, 3, 5);
    assert!(s.blocks().num_used() > 0);
    drop(running);
    drop(waiting);
    s.drop_cancelled();
    assert!(s.is_idle());
    assert_eq!(s.blocks().num_used(), 0);
    let mut m = EngineMetrics::default();
    s.fill_metrics(&mut m);
    assert_eq!((m.requests_aborted, m.running, m.waiting), (2, 0, 0));
}

#[test]
fn a_failed_step_fails_its_requests_and_frees_their_blocks() {
    let mut s = scheduler(16, 4, 64);
    let mut rx = add(&mut s, 5, 5);
    let schedule = s.schedule();
    s.fail_step(&schedule, "boom");
    assert!(s.is_idle());
    assert_eq!(s.blocks().num_used(), 0);
    let events: Vec<Event> = std::iter::from_fn(|| rx.try_recv().ok()).collect();
    assert!(
        matches!(events.last(), Some(Event::Failed(m)) if m == "boom"),
        "{events:?}"
    );
}

#[test]
fn a_preempted_sequence_resumes_from_its_cached_blocks() {
    let cache = crate::prefix_cache::PrefixCache::new(16, true, "model");
    let mut s = Scheduler::new(
        SchedulerConfig::default(),
        BlockManager::with_cache(16, BLOCK, cache),
        0,
        0,
    );
    let mut rx = add(&mut s, 10, 8);
    // Prefill the 10-token prompt, then two decodes: 13 tokens, 12 cached.
    for _ in 0..3 {
        let schedule = s.schedule();
        fake_step(&mut s, &schedule);
    }
    s.preempt(0);
    assert_eq!(s.blocks().num_used(), 0, "a preempted sequence holds no block");
    assert_eq!(s.blocks().num_cached_free(), 3, "its three full blocks stay cached");
    let schedule = s.schedule();
    // Recompute stops before the last token; at least one row of it runs: two blocks of
    // eight tokens come from the cache, and positions 8..12 are prefilled.
    assert_eq!(s.running().next().unwrap().num_cached, 8);
    assert_eq!(
        schedule,
        vec![(0, Work::Prefill(SchedulerConfig::default().max_num_batched_tokens))]
    );
    assert_eq!(s.work(&schedule)[0].1.span(s.running().next().unwrap()), (8, 4));
    fake_step(&mut s, &schedule);
    while !s.is_idle() {
        let schedule = s.schedule();
        fake_step(&mut s, &schedule);
    }
    assert_eq!(tokens(&mut rx), (8, Some(FinishReason::Length)));
    assert_eq!(s.blocks().num_used(), 0);
}

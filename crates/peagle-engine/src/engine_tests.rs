//! The step from inside, on the bundled demo model and its trained drafters: drafting that
//! resumes after a suspension gives the drafts of a drafter that never paused.

use super::*;
use crate::builder::{DraftModel, EngineBuilder};
use crate::request::GenerateParams;
use crate::scheduler::SchedulerConfig;
use peagle_models::DeviceIds;
use std::path::PathBuf;
use tokio::sync::mpsc::unbounded_channel;

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

fn demo(drafter: &str, parallel: bool) -> Engine {
    let builder = EngineBuilder {
        draft: Some(DraftModel {
            dir: repo(&format!("models/{drafter}")),
            k: Some(5),
            parallel,
        }),
        max_model_len: Some(1024),
        scheduler: SchedulerConfig {
            max_num_seqs: 1,
            adaptive_k: false,
            ..SchedulerConfig::default()
        },
        ..EngineBuilder::new(repo("models/pystdlib-12l"))
    };
    builder.build().unwrap().engine
}

fn add(engine: &mut Engine, prompt: Vec<u32>) {
    let params = GenerateParams {
        max_tokens: 64,
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let request = Request::new(prompt, params);
    // The events are not read: the sequence is looked at directly.
    let (events, rx) = unbounded_channel();
    std::mem::forget(rx);
    engine.add(request, events);
}

fn only_sequence(engine: &Engine) -> &Sequence {
    engine.scheduler.running().next().expect("a running sequence")
}

/// The drafts the sequence's next window verifies, which the last step left on the device.
fn drafts(seq: &Sequence) -> Vec<u32> {
    assert!(seq.drafts.is_empty(), "verified drafts are gone");
    let on_device = seq
        .drafts_on_device
        .as_ref()
        .map(|d| DeviceIds::to_host(&[d]).unwrap().remove(0));
    on_device.unwrap_or_default()
}

/// A sequence suspended from drafting for its prefill and 6 decode steps, then drafting with
/// k = 5, drafts what a sequence prefilled with the same tokens drafts at once; and the first
/// of those drafts at k = 2.
#[test]
fn drafting_after_a_suspension_matches_a_drafter_that_never_paused() {
    let prompt: Vec<u32> = (0..40).map(|i| 300 + (i * 37) % 900).collect();
    for (drafter, parallel) in [("pystdlib-12l-peagle", true), ("pystdlib-12l-eagle3", false)] {
        let mut paused = demo(drafter, parallel);
        add(&mut paused, prompt.clone());
        for _ in 0..7 {
            paused.step_at(Some(0));
            assert!(drafts(only_sequence(&paused)).is_empty());
        }
        paused.step_at(Some(5));
        let seq = only_sequence(&paused);
        assert!(seq.drafter_backlog.is_none());
        let want = drafts(seq);
        assert_eq!(want.len(), 5);

        let prefix = seq.token_ids[..seq.len() - 1].to_vec();
        for k in [5, 2] {
            let mut fresh = demo(drafter, parallel);
            add(&mut fresh, prefix.clone());
            fresh.step_at(Some(k));
            assert_eq!(only_sequence(&fresh).token_ids, seq.token_ids, "{drafter}");
            assert_eq!(drafts(only_sequence(&fresh)), want[..k], "{drafter} at k = {k}");
        }
    }
}

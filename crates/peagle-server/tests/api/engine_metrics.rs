//! /metrics exports where the engine's time goes, by phase, and the counters move with work.

use crate::common::{greedy, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_time_by_phase_moves_with_work() {
    let server = TestServer::start().await;
    let phase = |p: &str| format!("peagle:engine_step_seconds_total{{phase=\"{p}\"}}");
    let steps_before = server.metric("peagle:engine_steps_total").await;
    let target_before = server.metric(&phase("target")).await;
    server.ok("/v1/completions", greedy("def main():", 16)).await;
    let steps = server.metric("peagle:engine_steps_total").await - steps_before;
    // At least a prefill step, and at most one step per token after it.
    assert!((2.0..=16.0).contains(&steps), "{steps} steps");
    assert!(server.metric(&phase("target")).await > target_before);
    // The demo serves with its P-EAGLE drafter, so the drafter ran too.
    assert!(server.metric(&phase("drafter")).await > 0.0);
    for p in ["verify", "other"] {
        assert!(server.metric(&phase(p)).await >= 0.0);
    }
}

//! Percentiles, per-token gap attribution and level aggregation, with exact numbers.

use peagle_bench::{counter, per_token_gaps, percentile, LevelResult, RequestRecord, Summary};

#[test]
fn percentiles_interpolate_between_ranks() {
    let sorted = [1.0, 2.0, 3.0, 4.0];
    assert_eq!(percentile(&sorted, 0.0), 1.0);
    assert_eq!(percentile(&sorted, 50.0), 2.5);
    assert!((percentile(&sorted, 90.0) - 3.7).abs() < 1e-12);
    assert!((percentile(&sorted, 99.0) - 3.97).abs() < 1e-12);
    assert_eq!(percentile(&sorted, 100.0), 4.0);
    assert_eq!(percentile(&[10.0], 99.0), 10.0);
}

#[test]
fn summary_sorts_and_handles_empty() {
    let summary = Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
    assert_eq!(summary.mean, 2.5);
    assert_eq!(summary.p50, 2.5);
    assert!((summary.p99 - 3.97).abs() < 1e-12);
    assert_eq!(Summary::of(&[]), None);
}

#[test]
fn multi_token_chunks_share_their_gap() {
    // Chunks at 10, 30 and 60 ms carrying 5 tokens: 4 after the first, 2 per later chunk.
    assert_eq!(per_token_gaps(&[10.0, 30.0, 60.0], 5), vec![10.0, 10.0, 15.0, 15.0]);
    // One token per chunk: the gaps themselves.
    assert_eq!(per_token_gaps(&[0.0, 5.0, 12.0], 3), vec![5.0, 7.0]);
    // More gaps than tokens: a gap that delivered nothing whole is carried into the next.
    assert_eq!(per_token_gaps(&[0.0, 10.0, 20.0, 30.0], 3), vec![20.0, 10.0]);
    assert_eq!(per_token_gaps(&[5.0], 1), Vec::<f64>::new());
}

#[test]
fn level_aggregates_records() {
    let records = [
        RequestRecord {
            ttft_ms: 100.0,
            itl_ms: vec![100.0, 100.0, 100.0],
            e2e_ms: 400.0,
            completion_tokens: 4,
        },
        RequestRecord {
            ttft_ms: 200.0,
            itl_ms: vec![],
            e2e_ms: 200.0,
            completion_tokens: 1,
        },
    ];
    let level = LevelResult::from_records(2, &records, 2.0);
    assert_eq!(level.completed, 2);
    assert_eq!(level.total_output_tokens, 5);
    assert_eq!(level.request_throughput, 1.0);
    assert_eq!(level.output_throughput, 2.5);
    let ttft = level.ttft_ms.unwrap();
    assert_eq!((ttft.mean, ttft.p50), (150.0, 150.0));
    // Only the 4-token request has a TPOT: (400 - 100) / 3.
    let tpot = Summary {
        mean: 100.0,
        p50: 100.0,
        p90: 100.0,
        p99: 100.0,
    };
    assert_eq!(level.tpot_ms, Some(tpot));
    assert_eq!(level.itl_ms, Some(tpot));
    assert_eq!(level.e2e_ms.unwrap().p50, 300.0);
    assert_eq!(level.acceptance_length, None);
}

#[test]
fn counters_sum_over_models_and_filter_by_label() {
    let text = "# TYPE peagle:engine_step_seconds_total counter\n\
        peagle:engine_step_seconds_total{model_name=\"a\",phase=\"target\"} 1.5\n\
        peagle:engine_step_seconds_total{model_name=\"a\",phase=\"drafter\"} 0.25\n\
        peagle:engine_step_seconds_total{model_name=\"b\",phase=\"target\"} 2\n\
        peagle:engine_step_seconds_total_other 9\n";
    let name = "peagle:engine_step_seconds_total";
    assert_eq!(counter(text, name, "phase=\"target\""), Some(3.5));
    assert_eq!(counter(text, name, ""), Some(3.75));
    assert_eq!(counter(text, name, "phase=\"verify\""), None);
}

//! `peagle-bench sweep` driving the real peagle-serve binary: one server per mode, the
//! comparison (table, JSON, plot), and modes whose server cannot start.

use peagle_bench::{compare, run_sweep, write_sweep_report, Endpoint, Method, SweepConfig, SweepOutcome, Workload};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> String {
    format!("{}/../../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn config(dir: &Path, model: String, eagle3: Option<String>) -> SweepConfig {
    let dataset = dir.join("prompts.jsonl");
    std::fs::write(
        &dataset,
        "{\"prompt\": \"def f(x):\"}\n{\"prompt\": \"import os\\n\"}\n",
    )
    .unwrap();
    SweepConfig {
        serve_bin: PathBuf::from(env!("CARGO_BIN_EXE_peagle-serve")),
        model,
        peagle_draft_model: None,
        eagle3_draft_model: eagle3,
        peagle_k: vec![],
        eagle3_k: vec![1, 2],
        repeats: 2,
        // The fixture drafters are random: adaptive k would rightly stop drafting.
        server_args: vec!["--fixed-k".into()],
        workload: Workload {
            dataset,
            num_prompts: 3,
            concurrency: vec![1, 2],
            max_tokens: 6,
            temperature: 0.0,
            endpoint: Endpoint::Completions,
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_every_mode_and_compares_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), fixture("tiny-qwen3"), Some(fixture("tiny-qwen3-eagle3")));
    let out = dir.path().join("sweep");
    let outcome = run_sweep(&config, &out).await.unwrap();
    assert!(outcome.failures.is_empty(), "{:?}", outcome.failures);
    let runs = outcome.runs;
    let order: Vec<(String, usize)> = runs.iter().map(|r| (r.mode.name.clone(), r.repeat)).collect();
    let want: Vec<(String, usize)> = [
        ("no speculation", 0),
        ("EAGLE-3 K=1", 0),
        ("EAGLE-3 K=2", 0),
        ("EAGLE-3 K=1", 1),
        ("EAGLE-3 K=2", 1),
        ("no speculation", 1),
    ]
    .map(|(m, r)| (m.to_string(), r))
    .to_vec();
    assert_eq!(
        order, want,
        "modes interleave within each repeat, each repeat from another mode"
    );
    for run in &runs {
        for level in &run.result.levels {
            assert_eq!(level.total_output_tokens, 3 * 6);
        }
    }

    let throughput = |mode: &str, repeat: usize, concurrency: usize| {
        let run = runs.iter().find(|r| r.mode.name == mode && r.repeat == repeat).unwrap();
        let level = run.result.levels.iter().find(|l| l.concurrency == concurrency).unwrap();
        level.output_throughput
    };
    let report = compare(
        &config,
        SweepOutcome {
            runs: runs.clone(),
            failures: Vec::new(),
        },
    );
    assert_eq!(report.rows.len(), 3 * 2);
    for row in &report.rows {
        let paired: Vec<f64> = (0..2)
            .map(|r| throughput(&row.mode.name, r, row.concurrency) / throughput("no speculation", r, row.concurrency))
            .collect();
        assert_eq!(
            row.vs_no_speculation_per_repeat, paired,
            "{} at {}",
            row.mode.name, row.concurrency
        );
    }
    for concurrency in [1, 2] {
        let rows: Vec<_> = report.rows.iter().filter(|r| r.concurrency == concurrency).collect();
        assert_eq!(rows[0].mode.method, Method::Plain);
        assert_eq!(rows[0].vs_no_speculation, Some(1.0));
        assert_eq!(rows[0].acceptance_length, None);
        let best = rows[1..].iter().filter_map(|r| r.vs_best_eagle3).fold(0.0, f64::max);
        assert!(
            (best - 1.0).abs() < 1e-12,
            "the best EAGLE-3 mode is 1.00x of itself: {best}"
        );
        for row in &rows[1..] {
            assert_eq!(row.output_throughput.len(), 2, "one value per repeat");
            assert_eq!(row.mean_draft_length, Some(row.mode.k as f64));
            assert!(row.acceptance_length.is_some_and(|a| a >= 1.0));
        }
    }

    write_sweep_report(&report, &out).unwrap();
    let json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("sweep.json")).unwrap()).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), 6);
    assert_eq!(json["runs"].as_array().unwrap().len(), 6);
    let table = std::fs::read_to_string(out.join("sweep.md")).unwrap();
    assert!(table.contains("| concurrency | mode | output tok/s |"), "{table}");
    let plain_lines: Vec<&str> = table.lines().filter(|l| l.contains("| no speculation |")).collect();
    assert_eq!(plain_lines.len(), 2, "{table}");
    for line in plain_lines {
        assert!(
            line.contains("| 1.00x | 1.00x - 1.00x |"),
            "plain against itself: {line}"
        );
    }
    assert_eq!(table.matches("| EAGLE-3 K=2 |").count(), 2, "{table}");
    assert_eq!(&std::fs::read(out.join("sweep.png")).unwrap()[..4], b"\x89PNG");
    assert!(out.join("runs/eagle3-k2-r2/result.json").exists());
}

/// A mode whose server cannot start fails in each repeat; the sweep goes on with the others and
/// its report compares what finished and lists the failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mode_that_cannot_start_is_reported_and_the_others_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), fixture("tiny-qwen3"), Some("/no/such/drafter".into()));
    config.eagle3_k = vec![1];
    let out = dir.path().join("sweep");
    let outcome = run_sweep(&config, &out).await.unwrap();
    let ran: Vec<(&str, usize)> = outcome.runs.iter().map(|r| (r.mode.name.as_str(), r.repeat)).collect();
    assert_eq!(ran, [("no speculation", 0), ("no speculation", 1)]);
    let failed: Vec<(&str, usize)> = outcome
        .failures
        .iter()
        .map(|f| (f.mode.name.as_str(), f.repeat))
        .collect();
    assert_eq!(failed, [("EAGLE-3 K=1", 0), ("EAGLE-3 K=1", 1)]);
    assert!(
        outcome.failures[0].reason.contains("/no/such/drafter"),
        "{}",
        outcome.failures[0].reason
    );

    let report = compare(&config, outcome);
    write_sweep_report(&report, &out).unwrap();
    let table = std::fs::read_to_string(out.join("sweep.md")).unwrap();
    let eagle3: Vec<&str> = table.lines().filter(|l| l.contains("| EAGLE-3 K=1 |")).collect();
    assert_eq!(eagle3.len(), 2, "{table}");
    assert!(
        eagle3.iter().all(|l| l.contains("| EAGLE-3 K=1 | - | - | - |")),
        "{table}"
    );
    assert!(table.contains("## Failed runs"), "{table}");
    assert!(table.contains("- EAGLE-3 K=1, repeat 2: "), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.contains("| no speculation |") && l.contains("| 1.00x |")),
        "{table}"
    );
    assert_eq!(&std::fs::read(out.join("sweep.png")).unwrap()[..4], b"\x89PNG");
}

/// A level in which some requests fail (here a prompt longer than the model's context) is
/// recorded as a failure and left out of the comparison: it ran another workload than the
/// same level of the other modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_that_lost_requests_is_listed_and_not_compared() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), fixture("tiny-qwen3"), None);
    config.eagle3_k = vec![];
    config.repeats = 1;
    let too_long = "x = 1 ".repeat(400);
    std::fs::write(
        &config.workload.dataset,
        format!("{{\"prompt\": \"def f(x):\"}}\n{{\"prompt\": \"{too_long}\"}}\n"),
    )
    .unwrap();
    let out = dir.path().join("sweep");
    let outcome = run_sweep(&config, &out).await.unwrap();
    let reasons: Vec<&str> = outcome.failures.iter().map(|f| f.reason.as_str()).collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    for (reason, concurrency) in reasons.iter().zip([1, 2]) {
        assert!(
            reason.starts_with(&format!("concurrency {concurrency}: 1 of 3 requests failed")) && reason.contains("400"),
            "{reason}"
        );
    }
    assert_eq!(outcome.runs.len(), 1);
    assert!(outcome.runs[0].result.levels.is_empty());
    let summary = std::fs::read_to_string(out.join("runs/none-r1/summary.md")).unwrap();
    assert!(summary.contains("- concurrency 2: 1 of 3 requests failed"), "{summary}");
    let report = compare(&config, outcome);
    assert!(report.rows.iter().all(|r| r.output_throughput.is_empty()));
}

/// `peagle-bench prefix` on the tiny Llama: both servers run both workloads, and only the
/// caching one finds prompt tokens cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_compares_caching_with_none() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("prompts.jsonl");
    let lines: Vec<String> = (0..12)
        .map(|i| format!("{{\"prompt\": \"def f{i}(x):\\n    return [y * {i} for y in range(x)]\"}}"))
        .collect();
    std::fs::write(&dataset, lines.join("\n")).unwrap();
    let config = peagle_bench::PrefixConfig {
        serve_bin: PathBuf::from(env!("CARGO_BIN_EXE_peagle-serve")),
        model: fixture("tiny-llama"),
        server_args: vec![],
        dataset,
        prefix_tokens: 40,
        requests: 2,
        chat_prefix_tokens: 20,
        conversations: 2,
        turns: 2,
        max_tokens: 4,
    };
    let report = peagle_bench::run_prefix(&config).await.unwrap();
    assert!(!report.without.caching && report.with.caching);
    assert_eq!(report.without.hit_rate, 0.0);
    assert!(report.with.hit_rate > 0.2, "{report:?}");
    assert!(report.with.shared_prefix_tokens >= 40);
    let out = dir.path().join("prefix");
    peagle_bench::write_prefix_report(&report, &out).unwrap();
    let md = std::fs::read_to_string(out.join("prefix.md")).unwrap();
    assert!(md.contains("median TTFT") && md.contains("tokens/s"), "{md}");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(out.join("prefix.json")).unwrap()).unwrap();
    assert_eq!(json["with"]["caching"], true);
}

//! `peagle-bench sweep` driving the real peagle-serve binary: one server per mode, the
//! comparison (table, JSON, plot), and a mode whose server cannot start.

use peagle_bench::{compare, run_sweep, write_sweep_report, BenchError, Endpoint, Method, SweepConfig, Workload};
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
    let runs = run_sweep(&config, &out).await.unwrap();
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
    let report = compare(&config, runs.clone());
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

#[tokio::test]
async fn a_server_that_cannot_start_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "/no/such/model".into(), None);
    let error = run_sweep(&config, &dir.path().join("out")).await.unwrap_err();
    let BenchError::Server { what, reason } = &error else {
        panic!("{error}");
    };
    assert_eq!(what, "no speculation");
    assert!(reason.contains("/no/such/model"), "{reason}");
}

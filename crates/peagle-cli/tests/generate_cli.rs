//! peagle-generate as a user runs it: text on stdout, speed on stderr, one-line errors.

use std::process::{Command, Output};

fn generate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peagle-generate"))
        .args(args)
        .output()
        .unwrap()
}

fn fixture(name: &str) -> String {
    format!("{}/../../tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn streams_a_completion_and_reports_speed() {
    let model = fixture("tiny-llama");
    let out = generate(&[
        "--model",
        &model,
        "--prompt",
        "def f(x):",
        "--max-tokens",
        "12",
        "--ignore-eos",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty());
    assert!(
        stderr.contains("12 generated") && stderr.contains("tokens/s"),
        "{stderr}"
    );
}

/// `--json-schema` and `--regex` constrain the text: JSON the schema accepts, ended by the
/// model's end-of-sequence once whole, and text the regex matches.
#[test]
fn a_json_schema_or_a_regex_constrains_the_text() {
    let model = fixture("tiny-llama");
    let schema = r#"{"type": "object", "properties": {"k": {"enum": ["x", "yy"]}, "n": {"type": "integer"}}, "required": ["k", "n"]}"#;
    let out = generate(&[
        "--model",
        &model,
        "--prompt",
        "def f(x):",
        "--max-tokens",
        "60",
        "--json-schema",
        schema,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let value: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(
        ["x", "yy"].contains(&value["k"].as_str().unwrap()) && value["n"].is_i64(),
        "{value}"
    );

    let out = generate(&[
        "--model",
        &model,
        "--prompt",
        "def f(x):",
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--regex",
        "[a-c]+",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    let text = text.trim_end_matches('\n');
    assert!(
        !text.is_empty() && text.bytes().all(|b| (b'a'..=b'c').contains(&b)),
        "{text:?}"
    );
}

#[test]
fn seeded_sampling_repeats() {
    let model = fixture("tiny-qwen3");
    let args = [
        "--model",
        &model,
        "--prompt",
        "hello",
        "--max-tokens",
        "16",
        "--temperature",
        "0.8",
        "--top-p",
        "0.9",
        "--seed",
        "3",
        "--ignore-eos",
    ];
    assert_eq!(generate(&args).stdout, generate(&args).stdout);
}

/// `--device auto`, the default, is the CPU in a build without CUDA: the same text as `cpu`.
#[cfg(not(feature = "cuda"))]
#[test]
fn auto_is_the_cpu_without_cuda() {
    let model = fixture("tiny-llama");
    let on = |device: &str| {
        let out = generate(&[
            "--model",
            &model,
            "--prompt",
            "def f(x):",
            "--max-tokens",
            "8",
            "--device",
            device,
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    assert_eq!(on("auto"), on("cpu"));
}

#[test]
fn errors_are_one_line_with_non_zero_exit() {
    let model = fixture("tiny-llama");
    let prompts = format!("{model}/eval_prompts.jsonl");
    // A file that exists, to name as both the prompts and the stats.
    let config = format!("{model}/config.json");
    let cases: [(&[&str], &str); 9] = [
        (
            &[
                "--model",
                &model,
                "--prompt",
                "x",
                "--json-schema",
                "{\"type\": \"integer\", \"multipleOf\": 3}",
            ],
            "--json-schema: JSON schema keyword not supported at #: multipleOf",
        ),
        (
            &["--model", &model, "--prompt", "x", "--regex", "a("],
            "--regex: invalid regex",
        ),
        (
            &[
                "--model",
                &model,
                "--prompts-file",
                &prompts,
                "--device",
                "cpu",
                "--cuda-profile",
            ],
            "--cuda-profile needs a GPU, and this run is on the CPU",
        ),
        (
            &["--model", "/no/such/model", "--prompt", "x"],
            "missing model directory: /no/such/model",
        ),
        (
            &["--model", &model, "--prompt", "x", "--temperature", "-1"],
            "temperature must be a finite number >= 0",
        ),
        (
            &["--model", &model, "--prompt", "x", "--max-tokens", "0"],
            "max_tokens must be at least 1",
        ),
        (
            &["--model", &model, "--prompt", "x", "--max-batched-tokens", "0"],
            "--max-batched-tokens must be at least 1",
        ),
        (
            &[
                "--model",
                &model,
                "--prompts-file",
                &prompts,
                "--stats-json",
                "/no/such/dir/stats.json",
            ],
            "--stats-json /no/such/dir/stats.json: no such directory",
        ),
        (
            &["--model", &model, "--prompts-file", &config, "--stats-json", &config],
            "is the prompts file",
        ),
    ];
    for (args, message) in cases {
        let out = generate(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("peagle-generate: ") && stderr.contains(message),
            "{stderr}"
        );
    }
}

#[test]
fn prompts_file_with_a_drafter_writes_jsonl_and_stats() {
    let dir = std::env::temp_dir().join(format!("peagle-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.jsonl");
    std::fs::write(&prompts, "{\"prompt\": \"def f(x):\"}\n\n{\"prompt\": \"import os\"}\n").unwrap();
    let stats = dir.join("stats.json");
    let (model, drafter) = (fixture("tiny-llama"), fixture("tiny-llama-peagle"));
    let out = generate(&[
        "--model",
        &model,
        "--prompts-file",
        prompts.to_str().unwrap(),
        "--max-tokens",
        "10",
        "--ignore-eos",
        "--draft-model",
        &drafter,
        "--parallel-drafting",
        "--k",
        "3",
        "--stats-json",
        stats.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[1]["prompt"], "import os");
    assert_eq!(lines[1]["generated_tokens"], 10);
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert_eq!(s["generated_tokens"], 20);
    assert_eq!(
        s["num_draft_tokens"].as_u64().unwrap(),
        3 * s["num_drafts"].as_u64().unwrap()
    );
    for key in [
        "seconds",
        "tokens_per_second",
        "mean_acceptance_length",
        "per_position_acceptance",
        "num_accepted_tokens",
    ] {
        assert!(!s[key].is_null(), "{key} missing from {s}");
    }
    // One prefill step per prompt, then one verification per step.
    let times = &s["step_times"];
    assert_eq!(
        times["steps"].as_u64().unwrap(),
        s["num_drafts"].as_u64().unwrap() + 2,
        "{s}"
    );
    for phase in ["target_seconds", "drafter_seconds", "verify_seconds"] {
        assert!(times[phase].as_f64().unwrap() > 0.0, "{phase} in {s}");
    }
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(summary.contains("per step ("), "{summary}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn drafter_errors_are_clear() {
    let model = fixture("tiny-qwen3");
    let eagle3 = fixture("tiny-qwen3-eagle3");
    let out = generate(&[
        "--model",
        &model,
        "--prompt",
        "x",
        "--draft-model",
        &eagle3,
        "--parallel-drafting",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("parallel drafting needs a mask_token_id"), "{stderr}");
    let out = generate(&["--model", &model, "--prompt", "x", "--draft-model", "/no/drafter"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("missing drafter config: /no/drafter/config.json"),
        "{stderr}"
    );
    let out = generate(&["--model", &model, "--prompt", "x", "--draft-model", &eagle3, "--k", "0"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--k must be at least 1"));
}

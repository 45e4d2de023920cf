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

#[test]
fn errors_are_one_line_with_non_zero_exit() {
    let model = fixture("tiny-llama");
    let cases: [(&[&str], &str); 3] = [
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

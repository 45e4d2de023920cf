//! `peagle-bench sweep` as a command: a sweep whose runs fail still writes its report, then
//! exits non-zero saying how many failed; its servers get the device and dtype it was given.

use std::process::Command;

#[test]
fn the_sweep_command_fails_after_writing_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("prompts.jsonl");
    std::fs::write(&dataset, "{\"prompt\": \"def f(x):\"}\n").unwrap();
    let out = dir.path().join("sweep");
    let output = Command::new(env!("CARGO_BIN_EXE_peagle-bench"))
        .args(["sweep", "--model", "some-model", "--repeats", "2", "--num-prompts", "1"])
        .args(["--max-tokens", "2", "--concurrency", "1"])
        .args(["--device", "cuda:1", "--dtype", "bf16"])
        .args(["--serve-bin", "/no/such/peagle-serve", "--dataset"])
        .arg(&dataset)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("2 of 2 runs failed (listed in"), "{stderr}");
    let table = std::fs::read_to_string(out.join("sweep.md")).unwrap();
    for repeat in [1, 2] {
        let line = format!("- no speculation, repeat {repeat}: cannot run /no/such/peagle-serve");
        assert!(table.contains(&line), "{table}");
    }
    assert!(table.contains("| 1 | no speculation | - |"), "{table}");
    assert!(table.contains("--device cuda:1 --dtype bf16"), "{table}");
    assert!(!out.join("sweep.png").exists(), "nothing to plot");
}

/// Input that would lose or never finish work is refused before any server starts: a K
/// listed twice (its runs share a directory), more prompts than a level can hold, and a
/// prefix benchmark's --out that cannot be written.
#[test]
fn contradictory_or_impossible_input_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let dataset = dir.path().join("prompts.jsonl");
    std::fs::write(&dataset, "{\"prompt\": \"def f(x):\"}\n").unwrap();
    let dataset = dataset.to_str().unwrap();
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let out = not_a_dir.join("out");
    let out = out.to_str().unwrap();
    let serve = ["--serve-bin", "/no/such/peagle-serve", "--dataset", dataset];
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "sweep",
                "--model",
                "m",
                "--draft-model",
                "d",
                "--peagle-k",
                "3,5,3",
                "--out",
                "o",
            ],
            "--peagle-k lists 3 twice",
        ),
        (
            &[
                "sweep",
                "--model",
                "m",
                "--num-prompts",
                "18446744073709551615",
                "--out",
                "o",
            ],
            "must be at most 1000000",
        ),
        (&["prefix", "--model", "m", "--out", out], "cannot create --out"),
    ];
    for (args, message) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_peagle-bench"))
            .args(args)
            .args(serve)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains(message),
            "{args:?}: {stderr}"
        );
    }
    assert!(!dir.path().join("o").exists(), "nothing ran");
}

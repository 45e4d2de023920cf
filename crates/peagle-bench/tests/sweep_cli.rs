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

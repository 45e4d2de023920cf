//! What the commands refuse, in one line and a failing exit: malformed data, a fit with no
//! captured data, devices and dtypes the trainer does not take; and what capture skips rather
//! than fails on: prompts that leave no room to generate.

use super::{ok, train};
use crate::common::fixture;

#[test]
fn prompts_that_fill_max_len_are_skipped_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.jsonl");
    let long = "x = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]";
    std::fs::write(
        &data,
        format!("{{\"prompt\": \"{long}\"}}\n{{\"prompt\": \"def f():\"}}\n"),
    )
    .unwrap();
    let out = dir.path().join("captured");
    let model = fixture("tiny-llama");
    let args = [
        "capture",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
    ];
    ok(&[
        &args[..],
        &["--out", out.to_str().unwrap(), "--generate", "8", "--max-len", "16"],
    ]
    .concat());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("data_config.json")).unwrap()).unwrap();
    assert_eq!(config["num_samples"], 1);
}

#[test]
fn bad_input_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.jsonl");
    std::fs::write(&data, "{\"text\": \"x = 1\"}\n{\"prompt\": 3}\n").unwrap();
    let model = fixture("tiny-llama");
    let out = train(&[
        "capture",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        dir.path().join("o").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("line 2"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    let out = train(&[
        "fit",
        "--data",
        dir.path().to_str().unwrap(),
        "--out",
        dir.path().join("f").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("data_config.json"), "{stderr}");

    // Devices: a name that is none, and CUDA in a build without it.
    let mut devices = vec![("tpu", "expected auto, cpu, cuda or cuda:N")];
    if cfg!(not(feature = "cuda")) {
        devices.push(("cuda:0", "a build with the cuda feature"));
    }
    for (device, message) in devices {
        let out = train(&["fit", "--data", "d", "--out", "o", "--device", device]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(message), "{stderr}");
    }
    let out = train(&["fit", "--data", "d", "--out", "o", "--dtype", "bf16"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("the trainer computes in f32"),
        "{stderr}"
    );
}

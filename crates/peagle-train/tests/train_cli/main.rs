//! The two commands end to end on the tiny Llama: capture (text, prompt + response, and
//! on-policy generation), fit for both algorithms with validation, checkpoint and resume, and
//! the exported P-EAGLE drafter serving exactly the target's greedy output; and capture and
//! fit on the tiny MXFP4 gpt-oss; what either refuses or skips (`refusals`).

#[path = "../common/mod.rs"]
mod common;
mod refusals;

use common::fixture;
use peagle_engine::{DraftModel, GenerateParams, Generator, GeneratorOptions};
use peagle_models::LoadOptions;
use peagle_train::sample::Sample;
use peagle_train::TrainState;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn train(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peagle-train"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(args: &[&str]) {
    let out = train(args);
    assert!(
        out.status.success(),
        "peagle-train {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts the command failed with a one-line message containing `message`.
fn refused(out: Output, message: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains(message), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

fn report(dir: &Path) -> TrainState {
    serde_json::from_str(&std::fs::read_to_string(dir.join("train_report.json")).unwrap()).unwrap()
}

fn config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn first_and_last_val_loss(state: &TrainState) -> (f64, f64) {
    (state.history[0].val_loss, state.history.last().unwrap().val_loss)
}

const DATA: &str = r#"{"text": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"}
{"text": "for i in range(10):\n    print(i * i)\n"}
{"prompt": "class Point:", "response": "\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n"}
{"prompt": "import os\n"}
{"prompt": "def main():"}
{"prompt": "x = [1, 2, 3]"}
{"prompt": "while True:"}
{"prompt": "if __name__ == '__main__':"}
"#;

#[test]
fn capture_fit_resume_and_serve() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.jsonl");
    std::fs::write(&data, DATA).unwrap();
    let captured = dir.path().join("captured");
    let model = fixture("tiny-llama");
    let model = model.to_str().unwrap();
    let fixture_qwen = fixture("tiny-qwen3").to_str().unwrap().to_string();
    let (data_s, captured_s) = (data.to_str().unwrap(), captured.to_str().unwrap());
    let capture = [
        "capture",
        "--model",
        model,
        "--data",
        data_s,
        "--out",
        captured_s,
        "--generate",
        "40",
        "--max-len",
        "96",
    ];
    // Interrupted after four examples, then resumed: the same data as one run.
    ok(&[&capture[..], &["--limit", "4"]].concat());
    ok(&[&capture[..], &["--resume"]].concat());
    let once = dir.path().join("once");
    let mut single = capture.to_vec();
    single[6] = once.to_str().unwrap();
    ok(&single);
    for file in [
        "data_config.json",
        "token_freq.safetensors",
        "sample_0000007.safetensors",
    ] {
        let read = |d: &Path| std::fs::read(d.join(file)).unwrap();
        assert_eq!(read(&captured), read(&once), "{file} after resuming");
    }

    // A finished capture is not overwritten by a fresh one.
    refused(train(&capture), "resume it, or choose an empty output directory");
    // An interrupted capture resumes only from the target it was captured from: another's
    // states would be mixed in.
    let partial = dir.path().join("partial");
    let mut partial_capture = capture.to_vec();
    partial_capture[6] = partial.to_str().unwrap();
    ok(&[&partial_capture[..], &["--limit", "2"]].concat());
    partial_capture[2] = fixture_qwen.as_str();
    refused(
        train(&[&partial_capture[..], &["--resume"]].concat()),
        "holds states of",
    );
    let mut too_short = partial_capture.clone();
    too_short[10] = "2";
    refused(train(&too_short), "--max-len must be at least 3");

    // The prompt + response example: loss on the response only.
    let sample = Sample::load(&captured.join("sample_0000002.safetensors")).unwrap();
    assert_eq!(sample.hidden_states.dims()[1..], [4, 64]);
    assert!(!sample.loss_mask[0] && *sample.loss_mask.last().unwrap());
    // On-policy examples carry the target's own 40 tokens (or fewer, if it stopped).
    let generated = Sample::load(&captured.join("sample_0000004.safetensors")).unwrap();
    let learned = generated.loss_mask.iter().filter(|m| **m).count();
    assert!((1..=40).contains(&learned), "{learned} generated tokens");

    let peagle = dir.path().join("peagle");
    let fit = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "fit",
            "--data",
            captured_s,
            "--out",
            out.to_str().unwrap(),
            "--draft-vocab-size",
            "200",
            "--seq-len",
            "96",
            "--batch-size",
            "2",
            "--lr",
            "3e-3",
            "--warmup-steps",
            "2",
            "--epochs",
            "40",
            "--val-fraction",
            "0.25",
            "--eval-every",
            "5",
        ];
        args.extend_from_slice(extra);
        ok(&args);
        report(out)
    };
    // A 2-layer drafter over 4 depths, trained in two segments per sample.
    let shape = ["--num-layers", "2", "--num-depths", "4", "--partitions", "2"];
    let state = fit(&peagle, &[&shape[..], &["--max-steps", "20"]].concat());
    assert_eq!(state.step, 20);
    let (first, last) = first_and_last_val_loss(&state);
    assert!(last < 0.8 * first, "P-EAGLE validation loss {first} -> {last}");
    assert_eq!(
        state.history.last().unwrap().val_accuracy.len(),
        4,
        "accuracy per depth"
    );
    assert_eq!(
        config(&peagle)["norm_before_residual"],
        true,
        "new drafters norm their residual"
    );

    // A fresh run does not overwrite one in progress; resuming continues from its checkpoint,
    // and the history keeps its earlier points.
    refused(
        train(&["fit", "--data", captured_s, "--out", peagle.to_str().unwrap()]),
        "resume it, or choose another output directory",
    );
    // A resumed run keeps its algorithm and shape.
    let out = peagle.to_str().unwrap();
    let resume = [
        "fit",
        "--data",
        captured_s,
        "--out",
        out,
        "--resume",
        "--draft-vocab-size",
        "200",
    ];
    refused(
        train(&[&resume[..], &["--algo", "eagle3", "--num-layers", "2"]].concat()),
        "holds a peagle run: resume it as peagle",
    );
    refused(
        train(&[&resume[..], &["--num-layers", "3", "--num-depths", "4"]].concat()),
        "another shape than this run's",
    );
    // A schedule shorter than the steps taken would never end; no steps is no run.
    refused(
        train(&[&resume[..], &shape[..], &["--max-steps", "10"]].concat()),
        "the run is at step 20, past the",
    );
    refused(
        train(&[&resume[..], &shape[..], &["--max-steps", "0"]].concat()),
        "the most steps must be at least 1",
    );
    // A fresh run does not overwrite a model, a drafter exported by hand or the target.
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("config.json"), "{}").unwrap();
    refused(
        train(&["fit", "--data", captured_s, "--out", model.to_str().unwrap()]),
        "already holds a model (config.json): choose another output directory",
    );
    let only_weights: Vec<_> = std::fs::read_dir(peagle.join("checkpoint"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("weights"))
        .collect();
    assert_eq!(only_weights, ["weights-00000020.safetensors"]);
    // A checkpoint from before new drafters normed their residual resumes with the raw one it
    // was trained with.
    let choices = peagle.join("checkpoint/vocab.json");
    let mut legacy: Value = serde_json::from_str(&std::fs::read_to_string(&choices).unwrap()).unwrap();
    legacy.as_object_mut().unwrap().remove("norm_before_residual").unwrap();
    std::fs::write(&choices, legacy.to_string()).unwrap();
    let export_f32 = ["--export-dtype", "f32"];
    let resumed = fit(
        &peagle,
        &[&shape[..], &["--max-steps", "25", "--resume"], &export_f32].concat(),
    );
    assert_eq!(resumed.step, 25);
    assert_eq!(config(&peagle)["norm_before_residual"], false);
    assert_eq!(resumed.history.len(), state.history.len() + 1);
    for (a, b) in resumed.history.iter().zip(&state.history) {
        assert_eq!((a.step, a.val_loss), (b.step, b.val_loss));
    }

    // A new run from the exported drafter starts where it ended: with a learning rate too small
    // to move the weights, its first validation loss is the exported drafter's. That holds
    // only with the drafter's own residual layout, the raw one here.
    let init_from = |out: &str, drafter: &Path, extra: &[&str]| {
        let args = [
            "fit",
            "--data",
            captured_s,
            "--out",
            out,
            "--init-from",
            drafter.to_str().unwrap(),
        ];
        train(&[&args[..], extra].concat())
    };
    let warm = dir.path().join("warm");
    let warm_s = warm.to_str().unwrap();
    let tiny_lr = [
        "--seq-len",
        "96",
        "--val-fraction",
        "0.25",
        "--max-steps",
        "1",
        "--lr",
        "1e-12",
    ];
    let out = init_from(warm_s, &peagle, &[&tiny_lr[..], &shape].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (exported_loss, warm_loss) = (
        resumed.history.last().unwrap().val_loss,
        report(&warm).history[0].val_loss,
    );
    assert!(
        (warm_loss - exported_loss).abs() < 1e-4 * exported_loss,
        "exported at {exported_loss}, started from it at {warm_loss}"
    );
    assert_eq!(config(&warm)["norm_before_residual"], false);
    refused(init_from(warm_s, &peagle, &["--resume"]), "choose one");

    // Two capture directories train as one dataset of both directories' samples.
    let both = dir.path().join("both");
    let mut args = vec![
        "fit",
        "--data",
        captured_s,
        "--data",
        single[6],
        "--out",
        both.to_str().unwrap(),
    ];
    args.extend_from_slice(&["--draft-vocab-size", "200", "--seq-len", "96", "--max-steps", "1"]);
    ok(&args);
    let state = report(&both);
    assert_eq!(state.train_samples + state.val_samples, 16);

    let eagle3 = dir.path().join("eagle3");
    let state = fit(
        &eagle3,
        &[
            "--algo",
            "eagle3",
            "--num-layers",
            "1",
            "--num-depths",
            "3",
            "--max-steps",
            "20",
        ],
    );
    let (first, last) = first_and_last_val_loss(&state);
    assert!(last < 0.8 * first, "EAGLE-3 validation loss {first} -> {last}");
    // A drafter of another kind or shape cannot be continued as this one.
    let mismatch = dir.path().join("mismatch");
    let mismatch_s = mismatch.to_str().unwrap();
    refused(init_from(mismatch_s, &eagle3, &["--num-layers", "2"]), "of kind eagle3");
    let two_layers = ["--algo", "eagle3", "--num-layers", "2"];
    refused(init_from(mismatch_s, &eagle3, &two_layers), "layers.1");
    // Nor one that reads other target layers than the data holds.
    let other_layers = dir.path().join("other-layers");
    std::fs::create_dir(&other_layers).unwrap();
    std::fs::copy(eagle3.join("model.safetensors"), other_layers.join("model.safetensors")).unwrap();
    let mut reads = config(&eagle3);
    reads["eagle_aux_hidden_state_layer_ids"] = serde_json::json!([0, 1, 2]);
    std::fs::write(other_layers.join("config.json"), reads.to_string()).unwrap();
    let one_layer = ["--algo", "eagle3", "--num-layers", "1"];
    refused(
        init_from(mismatch_s, &other_layers, &one_layer),
        "reads the target's layers [0, 1, 2], but the data holds layers",
    );
    // The trained drafters serve: greedy output equals the target's alone.
    let opts = GeneratorOptions::default();
    let params = GenerateParams {
        max_tokens: 48,
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let prompt = [1u32, 17, 250, 33, 4];
    let mut plain = Generator::from_dir(&fixture("tiny-llama"), None, LoadOptions::default(), &opts).unwrap();
    let want = plain.generate(&prompt, &params, |_| {}).unwrap().token_ids;
    for (drafter, parallel) in [(&peagle, true), (&eagle3, false)] {
        let draft = DraftModel {
            dir: drafter.clone(),
            k: Some(3),
            parallel,
        };
        let mut spec =
            Generator::from_dir(&fixture("tiny-llama"), Some(&draft), LoadOptions::default(), &opts).unwrap();
        let got = spec.generate(&prompt, &params, |_| {}).unwrap();
        assert_eq!(got.token_ids, want, "speculative output of {}", drafter.display());
        assert!(got.spec_stats.num_drafts > 0);
    }
}

/// gpt-oss as the target (MXFP4 experts, sinks, sliding windows): its states are captured,
/// a P-EAGLE drafter fits them, and the exported drafter serves the target's greedy output.
#[test]
fn captures_and_fits_a_drafter_for_gpt_oss() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.jsonl");
    std::fs::write(&data, DATA).unwrap();
    let (captured, drafter) = (dir.path().join("captured"), dir.path().join("peagle"));
    let target = fixture("tiny-gpt-oss-mxfp4");
    let path = |p: &Path| p.to_str().unwrap().to_string();
    ok(&[
        "capture",
        "--model",
        &path(&target),
        "--data",
        &path(&data),
        "--out",
        &path(&captured),
        "--generate",
        "16",
        "--max-len",
        "48",
    ]);
    let sample = Sample::load(&captured.join("sample_0000000.safetensors")).unwrap();
    assert_eq!(sample.hidden_states.dims()[1..], [4, 64]);
    ok(&[
        "fit",
        "--data",
        &path(&captured),
        "--out",
        &path(&drafter),
        "--seq-len",
        "48",
        "--batch-size",
        "2",
        "--lr",
        "3e-3",
        "--warmup-steps",
        "2",
        "--epochs",
        "20",
        "--val-fraction",
        "0.25",
        "--eval-every",
        "4",
        "--num-layers",
        "1",
        "--num-depths",
        "3",
        "--max-steps",
        "12",
    ]);
    let (first, last) = first_and_last_val_loss(&report(&drafter));
    assert!(last < first, "P-EAGLE validation loss {first} -> {last}");

    let opts = GeneratorOptions::default();
    let params = GenerateParams {
        max_tokens: 24,
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let prompt = [2u32, 17, 250, 33, 4];
    let mut plain = Generator::from_dir(&target, None, LoadOptions::default(), &opts).unwrap();
    let want = plain.generate(&prompt, &params, |_| {}).unwrap().token_ids;
    let draft = DraftModel {
        dir: drafter,
        k: Some(3),
        parallel: true,
    };
    let mut spec = Generator::from_dir(&target, Some(&draft), LoadOptions::default(), &opts).unwrap();
    let got = spec.generate(&prompt, &params, |_| {}).unwrap();
    assert_eq!(got.token_ids, want);
    assert!(got.spec_stats.num_drafts > 0);
}

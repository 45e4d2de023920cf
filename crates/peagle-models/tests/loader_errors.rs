//! Every way a model directory can be broken gets an error naming the file and the tensor.

mod common;
use candle_core::{DType, Device, Tensor};
use common::*;
use peagle_models::{load_target, LoadError, LoadOptions};
use std::collections::HashMap;
use std::path::Path;

/// A copy of tiny-llama whose weights are `edit`ed before saving.
fn broken_llama(edit: impl FnOnce(&mut HashMap<String, Tensor>)) -> tempfile::TempDir {
    let src = fixture_dir("tiny-llama");
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut weights = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    edit(&mut weights);
    candle_core::safetensors::save(&weights, dir.path().join("model.safetensors")).unwrap();
    dir
}

fn load_err(dir: &Path) -> LoadError {
    match load_target(dir, LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn missing_directory_and_weights_are_named() {
    let err = load_err(Path::new("/nonexistent/model"));
    assert_eq!(err.to_string(), "missing model directory: /nonexistent/model");

    let dir = broken_llama(|_| {});
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(
            err,
            LoadError::MissingFile {
                what: "weights file",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().ends_with("model.safetensors"), "{err}");
}

#[test]
fn missing_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture_dir("tiny-qwen3");
    for f in [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00004.safetensors",
    ] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let err = load_err(dir.path());
    assert!(err.to_string().contains("model-00002-of-00004.safetensors"), "{err}");
}

#[test]
fn unknown_architecture_lists_the_supported_ones() {
    let dir = broken_llama(|_| {});
    let cfg = dir.path().join("config.json");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("LlamaForCausalLM", "FooForCausalLM");
    std::fs::write(&cfg, text).unwrap();
    let msg = load_err(dir.path()).to_string();
    assert!(msg.contains("unknown architecture \"FooForCausalLM\""), "{msg}");
    assert!(msg.contains("supported: LlamaForCausalLM, Qwen3ForCausalLM"), "{msg}");
}

#[test]
fn broken_config_json_names_the_file() {
    let dir = broken_llama(|_| {});
    std::fs::write(dir.path().join("config.json"), "{ not json").unwrap();
    let msg = load_err(dir.path()).to_string();
    assert!(msg.starts_with("cannot parse ") && msg.contains("config.json"), "{msg}");
}

#[test]
fn missing_tensor_is_named() {
    let dir = broken_llama(|w| {
        w.remove("model.layers.1.mlp.up_proj.weight");
    });
    let msg = load_err(dir.path()).to_string();
    assert!(
        msg.starts_with("tensor model.layers.1.mlp.up_proj.weight not found in"),
        "{msg}"
    );
}

#[test]
fn shape_mismatch_gives_expected_and_found() {
    let dir = broken_llama(|w| {
        w.insert(
            "model.norm.weight".into(),
            Tensor::ones(65, DType::F32, &Device::Cpu).unwrap(),
        );
    });
    let msg = load_err(dir.path()).to_string();
    assert!(msg.contains("tensor model.norm.weight in"), "{msg}");
    assert!(msg.contains("expected shape [64], found [65]"), "{msg}");
}

#[test]
fn unsupported_dtype_is_named() {
    let dir = broken_llama(|w| {
        w.insert(
            "model.norm.weight".into(),
            Tensor::ones(64, DType::I64, &Device::Cpu).unwrap(),
        );
    });
    let msg = load_err(dir.path()).to_string();
    assert!(
        msg.contains("tensor model.norm.weight in") && msg.contains("unsupported dtype I64"),
        "{msg}"
    );
}

#[test]
fn f16_weights_load_and_equal_their_f32_upcast() {
    let as_f16 = broken_llama(|w| {
        for t in w.values_mut() {
            *t = t.to_dtype(DType::F16).unwrap();
        }
    });
    let upcast = broken_llama(|w| {
        for t in w.values_mut() {
            *t = t.to_dtype(DType::F16).unwrap().to_dtype(DType::F32).unwrap();
        }
    });
    let logits = |dir: &Path| {
        let model = load_target(dir, LoadOptions::default()).unwrap().model;
        let kv = peagle_models::KvCache::new(model.dims(), 8, BLOCK, candle_core::DType::F32, &Device::Cpu).unwrap();
        let mut b = peagle_models::BatchBuilder::new(BLOCK);
        b.add(
            &[5, 9, 200, 3],
            0,
            &[0],
            peagle_models::Rows::All,
            peagle_models::Rows::None,
        )
        .unwrap();
        bits(&model.forward(&b.build(), &kv).unwrap().logits)
    };
    assert_eq!(logits(as_f16.path()), logits(upcast.path()));
}

//! Shared helpers of the engine tests.

#![allow(dead_code)]

use peagle_engine::{DraftModel, Generator, GeneratorOptions};
use peagle_models::LoadOptions;
use std::path::PathBuf;

/// A checked-in fixture model or drafter under the repository's tests/fixtures.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// A path under the repository's root.
pub fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

/// The first `n` eval prompts of the demo model, tokenized by `g`.
pub fn eval_prompts(g: &Generator, n: usize) -> Vec<Vec<u32>> {
    #[derive(serde::Deserialize)]
    struct Line {
        prompt: String,
    }
    let text = std::fs::read_to_string(repo("models/pystdlib-12l/eval_prompts.jsonl")).unwrap();
    text.lines()
        .take(n)
        .map(|l| {
            let prompt = serde_json::from_str::<Line>(l).unwrap().prompt;
            g.tokenizer().unwrap().encode(prompt, true).unwrap().get_ids().to_vec()
        })
        .collect()
}

/// The demo model placed by `options`, with a drafter when one is given.
pub fn demo(options: &LoadOptions, draft: Option<DraftModel>) -> Generator {
    demo_with(options, draft, &GeneratorOptions::default())
}

/// `demo` with the generator's options `opts`.
pub fn demo_with(options: &LoadOptions, draft: Option<DraftModel>, opts: &GeneratorOptions) -> Generator {
    Generator::from_dir(&repo("models/pystdlib-12l"), draft.as_ref(), options.clone(), opts).unwrap()
}

/// tiny-qwen3-eagle3 with `d2t[i] = token - i`: every draft maps to `token`.
pub fn constant_drafter(token: i64) -> tempfile::TempDir {
    let src = fixture("tiny-qwen3-eagle3");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let d2t: Vec<u8> = (0..384i64).flat_map(|i| (token - i).to_le_bytes()).collect();
    let mut tensors = st.tensors();
    tensors.push((
        "d2t".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![384], &d2t).unwrap(),
    ));
    safetensors::serialize_to_file(tensors, None, &dir.path().join("model.safetensors")).unwrap();
    dir
}

/// A tiny-qwen3 prompt whose greedy continuation repeats token 203.
pub fn repeating_prompt() -> Vec<u32> {
    let refs = candle_core::safetensors::load(
        fixture("tiny-qwen3").join("reference.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    refs["p1.input_ids"]
        .to_vec1::<i64>()
        .unwrap()
        .into_iter()
        .map(|t| t as u32)
        .collect()
}

//! The bundled demo model (models/pystdlib-12l) continues held-out prompts exactly as
//! transformers does: 64 greedy tokens each, references made by scripts/train_demo_model.py.

use peagle_engine::{GenerateParams, Generator, GeneratorOptions, SamplingParams};
use peagle_models::LoadOptions;
use std::path::PathBuf;

#[derive(serde::Deserialize)]
struct Reference {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
}

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(path)
}

#[test]
fn greedy_continuations_equal_transformers() {
    let refs: Vec<Reference> =
        serde_json::from_str(&std::fs::read_to_string(repo("tests/fixtures/demo_greedy.json")).unwrap()).unwrap();
    assert_eq!(refs.len(), 3);
    let mut g = Generator::from_dir(
        &repo("models/pystdlib-12l"),
        None,
        LoadOptions::default(),
        &GeneratorOptions::default(),
    )
    .unwrap();
    let params = GenerateParams {
        max_tokens: 64,
        sampling: SamplingParams::default(),
        ignore_eos: true,
    };
    for r in &refs {
        let ids = g
            .tokenizer()
            .unwrap()
            .encode(r.prompt.as_str(), true)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(ids, r.prompt_ids, "the Rust tokenizer must agree with the Python one");
        let out = g.generate(&r.prompt_ids, &params, |_| {}).unwrap();
        assert_eq!(out.token_ids, r.greedy_ids, "prompt {:?}", r.prompt);
    }
}

//! The generation loop reproduces transformers' greedy continuations, however the prefill is
//! chunked, and rejects bad requests with an error.

use candle_core::Device;
use peagle_engine::GenerateError;
use peagle_engine::{FinishReason, GenerateParams, Generator, GeneratorOptions, SamplingParams};
use peagle_models::LoadOptions;
mod common;
use common::fixture;

fn generator(name: &str, opts: GeneratorOptions) -> Generator {
    Generator::from_dir(&fixture(name), None, LoadOptions::default(), &opts).unwrap()
}

fn reference(name: &str, prompt: usize, what: &str) -> Vec<u32> {
    let refs = candle_core::safetensors::load(fixture(name).join("reference.safetensors"), &Device::Cpu).unwrap();
    let ids: Vec<i64> = refs[&format!("p{prompt}.{what}")].to_vec1().unwrap();
    ids.into_iter().map(|t| t as u32).collect()
}

fn greedy(max_tokens: usize) -> GenerateParams {
    GenerateParams {
        max_tokens,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        ..GenerateParams::default()
    }
}

#[test]
fn greedy_generation_equals_transformers() {
    for name in ["tiny-llama", "tiny-qwen3"] {
        for chunk in [512, 7] {
            let mut g = generator(
                name,
                GeneratorOptions {
                    max_batched_tokens: chunk,
                    ..Default::default()
                },
            );
            for p in 0..3 {
                let out = g
                    .generate(&reference(name, p, "input_ids"), &greedy(16), |_| {})
                    .unwrap();
                assert_eq!(
                    out.token_ids,
                    reference(name, p, "greedy"),
                    "{name} prompt {p}, chunks of {chunk}"
                );
                assert_eq!(out.finish_reason, FinishReason::Length);
            }
        }
    }
}

#[test]
fn streamed_text_is_the_decoded_output() {
    let mut g = generator("tiny-llama", GeneratorOptions::default());
    let mut streamed = String::new();
    let prompt = g.prompt_ids("def add(a, b):").unwrap();
    let out = g.generate_text(&prompt, &greedy(24), |t| streamed.push_str(t)).unwrap();
    let decoded = g.tokenizer().unwrap().decode(&out.token_ids, false).unwrap();
    assert_eq!(out.token_ids.len(), 24);
    assert_eq!(streamed, decoded);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let mut g = generator("tiny-qwen3", GeneratorOptions::default());
    let params = GenerateParams {
        max_tokens: 20,
        sampling: SamplingParams {
            temperature: 0.9,
            top_k: 50,
            top_p: 0.95,
            seed: Some(42),
            ..SamplingParams::default()
        },
        ignore_eos: true,
        ..GenerateParams::default()
    };
    let prompt = reference("tiny-qwen3", 1, "input_ids");
    let mut run = |seed| {
        let params = GenerateParams {
            sampling: SamplingParams {
                seed: Some(seed),
                ..params.sampling.clone()
            },
            ..params.clone()
        };
        g.generate(&prompt, &params, |_| {}).unwrap().token_ids
    };
    let (a, b, c) = (run(42), run(42), run(43));
    assert_eq!(a, b);
    assert_ne!(a, c, "another seed should give another sample");
    assert_ne!(
        a[..16],
        reference("tiny-qwen3", 1, "greedy")[..],
        "sampling should differ from greedy"
    );
}

#[test]
fn generation_stops_at_end_of_sequence() {
    let prompt = reference("tiny-llama", 0, "input_ids");
    let free = reference("tiny-llama", 0, "greedy");
    // A copy of the model whose generation_config.json declares the 4th greedy token as EOS.
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(fixture("tiny-llama")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let eos = free[3];
    std::fs::write(
        dir.path().join("generation_config.json"),
        format!("{{\"eos_token_id\": [{eos}, 99999]}}"),
    )
    .unwrap();
    assert!(
        !free[..3].contains(&eos),
        "fixture's greedy tokens must not repeat the EOS early"
    );
    let mut g = Generator::from_dir(dir.path(), None, LoadOptions::default(), &GeneratorOptions::default()).unwrap();
    let out = g
        .generate(
            &prompt,
            &GenerateParams {
                ignore_eos: false,
                ..greedy(16)
            },
            |_| {},
        )
        .unwrap();
    assert_eq!(out.finish_reason, FinishReason::Stop);
    // The end-of-sequence token counts as generated, as in vLLM.
    assert_eq!(out.token_ids, free[..4].to_vec());
}

#[test]
fn bad_requests_are_errors() {
    let mut g = generator(
        "tiny-llama",
        GeneratorOptions {
            max_model_len: Some(20),
            ..Default::default()
        },
    );
    let long = reference("tiny-llama", 1, "input_ids");
    let err = |r: Result<_, GenerateError>| r.map(|_: peagle_engine::GenerateOutput| ()).unwrap_err().to_string();
    assert_eq!(err(g.generate(&[], &greedy(4), |_| {})), "the prompt is empty");
    assert_eq!(
        err(g.generate(&[5], &greedy(0), |_| {})),
        "max_tokens must be at least 1"
    );
    assert_eq!(
        err(g.generate(&long, &greedy(4), |_| {})),
        "the prompt has 23 tokens but the model's context is 20 tokens"
    );
    let hot = GenerateParams {
        sampling: SamplingParams {
            temperature: -1.0,
            ..Default::default()
        },
        ..greedy(4)
    };
    assert!(err(g.generate(&[5], &hot, |_| {})).contains("temperature"));
    // A request that reaches the length limit ends with Length, and the cache is free again.
    let out = g.generate(&long[..15], &greedy(100), |_| {}).unwrap();
    assert_eq!((out.token_ids.len(), out.finish_reason), (5, FinishReason::Length));
    assert_eq!(
        g.generate(&long[..15], &greedy(100), |_| {}).unwrap().token_ids,
        out.token_ids
    );
}

#[test]
fn stop_token_ids_end_the_output_and_min_tokens_holds_them_back() {
    let prompt = reference("tiny-llama", 0, "input_ids");
    let free = reference("tiny-llama", 0, "greedy");
    let stop = free[3];
    assert!(
        !free[..3].contains(&stop),
        "fixture's greedy tokens must not repeat early"
    );
    let mut g = generator("tiny-llama", GeneratorOptions::default());
    let stopped = GenerateParams {
        stop_token_ids: vec![stop],
        ..greedy(16)
    };
    let out = g.generate(&prompt, &stopped, |_| {}).unwrap();
    assert_eq!(out.finish_reason, FinishReason::StopToken(stop));
    assert_eq!(out.token_ids, free[..4].to_vec(), "the stop token is kept");

    // Held back until 6 tokens are out, the stop token cannot be the 4th.
    let held = GenerateParams {
        min_tokens: 6,
        ..stopped
    };
    let out = g.generate(&prompt, &held, |_| {}).unwrap();
    assert_eq!(out.token_ids[..3], free[..3]);
    assert_ne!(out.token_ids[3], stop);
    assert!(out.token_ids.len() >= 6, "{:?}", out.token_ids);
    assert!(!out.token_ids[..5].contains(&stop));
}

//! The FP8 (e4m3) KV cache on the fixture models: the error it adds to the logits, against HF's
//! and beside a bf16 cache's, and the per-layer scales FP8 checkpoints carry.
//! (Its batch invariance is in batch_invariance.rs, with the other cache dtypes.)

mod common;
use candle_core::{DType, Device, Tensor};
use common::*;
use peagle_models::{load_target, LoadError, LoadOptions};
use std::collections::HashMap;

/// The logits' error against HF's over the three prompts, as a fraction of their size:
/// sqrt(sum of squared differences / sum of squared reference logits).
fn relative_error(f: &Fixture) -> f64 {
    let (mut err, mut size) = (0.0, 0.0);
    for p in 0..3 {
        let kv = f.cache();
        let got = run(f.model.as_ref(), &kv, &[(0, &f.prompt(p), 0)]).remove(0).0;
        let want = f.reference(p, "logits");
        let squares = |t: &Tensor| -> f64 { t.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64 };
        err += squares(&(&got - &want).unwrap());
        size += squares(&want);
    }
    (err / size).sqrt()
}

/// e4m3 rounds each key and value to 4 bits of mantissa, bf16 to 8: 16 times the rounding
/// step. The logits' error follows, within a factor of 4 either way on these models (MoE
/// routing turns some small changes into large ones).
#[test]
fn fp8_logits_err_as_e4m3_rounding_does_beside_bf16() {
    for name in FIXTURES {
        let f = Fixture::load(name).with_cache_dtype(DType::BF16);
        let bf16 = relative_error(&f);
        let fp8 = relative_error(&f.with_cache_dtype(DType::F8E4M3));
        assert!(bf16 < 0.01, "{name}: bf16 cache, relative error {bf16}");
        assert!(fp8 < 0.2, "{name}: fp8 cache, relative error {fp8}");
        assert!(
            (4.0..64.0).contains(&(fp8 / bf16)),
            "{name}: fp8 {fp8} against bf16 {bf16}"
        );
    }
}

/// A copy of tiny-llama, its reference included, with `extra` tensors added to its weights.
fn llama_with(extra: &[(String, Tensor)]) -> tempfile::TempDir {
    let src = fixture_dir("tiny-llama");
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "generation_config.json", "reference.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut weights: HashMap<String, Tensor> =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    weights.extend(extra.iter().cloned());
    candle_core::safetensors::save(&weights, dir.path().join("model.safetensors")).unwrap();
    dir
}

fn scalar(x: f32) -> Tensor {
    Tensor::new(x, &Device::Cpu).unwrap()
}

/// Keys stored at 8 times their size, values at 16 (scales 1/8 and 1/16), in each of the
/// three namings. Written and read back with the scale, the logits stay within e4m3's
/// error; they differ from an unscaled FP8 cache's (e4m3's subnormals and rounding fall
/// elsewhere); and caches of other dtypes ignore the scales, bit for bit.
#[test]
fn checkpoint_kv_scales_apply_to_fp8_caches_only() {
    let names = [
        ("k_scale", "v_scale"),
        ("k_proj.k_scale", "v_proj.v_scale"),
        ("k_proj.output_scale", "v_proj.output_scale"),
    ];
    let extra: Vec<(String, Tensor)> = (0..4)
        .flat_map(|layer| {
            let (k, v) = names[layer % 3];
            let prefix = format!("model.layers.{layer}.self_attn");
            [
                (format!("{prefix}.{k}"), scalar(0.125)),
                (format!("{prefix}.{v}"), scalar(0.0625)),
            ]
        })
        .collect();
    let dir = llama_with(&extra);
    let scaled = Fixture::load_from(dir.path(), LoadOptions::default());
    let plain = Fixture::load("tiny-llama");
    let logits = |f: &Fixture| run(f.model.as_ref(), &f.cache(), &[(0, &f.prompt(2), 0)]).remove(0).0;
    assert_eq!(
        bits(&logits(&scaled)),
        bits(&logits(&plain)),
        "an f32 cache ignores the scales"
    );

    let (scaled, plain) = (
        scaled.with_cache_dtype(DType::F8E4M3),
        plain.with_cache_dtype(DType::F8E4M3),
    );
    let error = relative_error(&scaled);
    assert!(error < 0.2, "fp8 cache with scales: relative error {error}");
    assert_ne!(bits(&logits(&scaled)), bits(&logits(&plain)), "the scales are used");
}

#[test]
fn a_kv_scale_that_is_not_one_positive_number_is_a_load_error() {
    let name = "model.layers.1.self_attn.v_scale";
    for (bad, why) in [
        (scalar(0.0), "must be a positive number, not 0"),
        (scalar(f32::NAN), "must be a positive number, not NaN"),
        (
            Tensor::new(&[0.5f32, 0.5], &Device::Cpu).unwrap(),
            "must hold one value, not shape [2]",
        ),
    ] {
        let dir = llama_with(&[(name.to_owned(), bad)]);
        let err = match load_target(dir.path(), LoadOptions::default()) {
            Ok(_) => panic!("a bad {name} loaded"),
            Err(e) => e,
        };
        assert!(matches!(err, LoadError::InvalidTensor { .. }), "{err}");
        assert!(err.to_string().starts_with(&format!("tensor {name}: ")), "{err}");
        assert!(err.to_string().contains(why), "{err}");
    }
}

//! Block-scaled FP8 checkpoints (`quant_method: "fp8"` with `weight_block_size`): tiny-llama
//! quantized as FP8 checkpoints are runs as the dense model of its dequantized weights, its
//! rows keep their bits however they are batched, and broken ones are named.

mod common;
use candle_core::Device;
use common::*;
use peagle_models::{load_target, LoadError, LoadOptions};
use std::path::Path;

/// Blocks that tile every projection (q, k and v, and gate and up, stay FP8 once fused) and
/// blocks whose rows do not divide q or gate (those fused weights are dequantized at load):
/// either way the logits are the dense model's of the same values, up to summation order.
#[test]
fn an_fp8_checkpoint_runs_as_the_dense_model_of_its_dequantized_weights() {
    for block in [(16, 32), (48, 32)] {
        let (fp8, dense) = fp8_and_dense(block);
        let fp8 = Fixture::load_from(fp8.path(), LoadOptions::default());
        let dense = Fixture::load_from(dense.path(), LoadOptions::default());
        for p in 0..3 {
            let logits = |f: &Fixture| run(f.model.as_ref(), &f.cache(), &[(0, &f.prompt(p), 0)]).remove(0).0;
            let diff = max_abs_diff(&logits(&fp8), &logits(&dense));
            assert!(diff < 1e-4, "blocks {block:?}, prompt {p}: {diff}");
            // And FP8's rounding of the original weights: a few percent of the logits.
            let diff = max_abs_diff(&logits(&fp8), &fp8.reference(p, "logits"));
            assert!(
                diff < 0.5,
                "blocks {block:?}, prompt {p}: {diff} from the unquantized model"
            );
        }
        let (singles, windowed, batched) = window_three_ways(&fp8, 8);
        assert_eq!(bits(&windowed.0), bits(&singles.0), "blocks {block:?}: window");
        assert_eq!(bits(&batched.0), bits(&singles.0), "blocks {block:?}: mixed batch");
    }
}

fn load_err(dir: &Path) -> String {
    match load_target(dir, LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => {
            let text = e.to_string();
            assert!(
                matches!(e, LoadError::InvalidConfig { .. } | LoadError::InvalidTensor { .. }),
                "{text}"
            );
            text
        }
    }
}

#[test]
fn broken_fp8_checkpoints_are_named() {
    let (fp8, _) = fp8_and_dense((16, 32));
    let weights = candle_core::safetensors::load(fp8.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let no_config = llama_copy(&weights, |_| {});
    let err = load_err(no_config.path());
    assert!(
        err.contains("_proj.weight: stored in FP8, but config.json has no quantization_config"),
        "{err}"
    );
    let per_tensor = llama_copy(&weights, |c| {
        c["quantization_config"] = serde_json::json!({"quant_method": "fp8"})
    });
    assert!(load_err(per_tensor.path()).contains("without quantization_config.weight_block_size"));
    let odd = llama_copy(&weights, fp8_config(serde_json::json!([16, 12])));
    assert!(load_err(odd.path()).contains("[16, 12]: FP8 blocks must be"));
}

//! Checkpoints made from the fixtures for a test: copies with tensors dropped or replaced and
//! the config edited, and block-scaled FP8 ones beside their dequantized twins.

use super::fixture_dir;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;

/// Copies a safetensors file, dropping the tensors `keep` rejects. Works on raw bytes, so it
/// keeps dtypes candle cannot load (the bool `t2d`).
pub fn copy_safetensors(src: &std::path::Path, dst: &std::path::Path, keep: impl Fn(&str) -> bool) {
    let bytes = std::fs::read(src).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| keep(n)).collect();
    safetensors::serialize_to_file(kept, None, dst).unwrap();
}

/// Raw bytes of one tensor of a safetensors file.
pub fn raw_tensor(path: &std::path::Path, name: &str) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensor(name).unwrap().data().to_vec()
}

/// The projections FP8 checkpoints quantize (embeddings, norms and lm_head stay dense).
pub fn quantized_name(name: &str) -> bool {
    name.contains("_proj.weight")
}

/// `w` [out, in] in e4m3 blocks of `block`, each scaled so its largest value is 448, and the
/// scales; with the dequantized weight the model will multiply by.
pub fn quantize(w: &Tensor, (bn, bk): (usize, usize)) -> (Tensor, Tensor, Tensor) {
    let rows: Vec<Vec<f32>> = w.to_vec2().unwrap();
    let (out, inner) = (rows.len(), rows[0].len());
    let (sr, sc) = (out.div_ceil(bn), inner.div_ceil(bk));
    let mut scales = vec![0f32; sr * sc];
    for (r, row) in rows.iter().enumerate() {
        for (c, v) in row.iter().enumerate() {
            let s = &mut scales[r / bn * sc + c / bk];
            *s = s.max(v.abs() / 448.0);
        }
    }
    let scaled: Vec<f32> = (0..out * inner)
        .map(|i| rows[i / inner][i % inner] / scales[i / inner / bn * sc + i % inner / bk])
        .collect();
    let fp8 = Tensor::from_vec(scaled, (out, inner), &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F8E4M3)
        .unwrap();
    let per_value: Vec<f32> = (0..out * inner)
        .map(|i| scales[i / inner / bn * sc + i % inner / bk])
        .collect();
    let dequantized =
        (fp8.to_dtype(DType::F32).unwrap() * Tensor::from_vec(per_value, (out, inner), &Device::Cpu).unwrap()).unwrap();
    (
        fp8,
        Tensor::from_vec(scales, (sr, sc), &Device::Cpu).unwrap(),
        dequantized,
    )
}

/// A copy of tiny-llama (reference included) with `weights` and `config` edited.
pub fn llama_copy(weights: &HashMap<String, Tensor>, config: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    fixture_copy("tiny-llama", weights, config)
}

/// A copy of fixture `name` (reference included) with `weights` and `config` edited.
pub fn fixture_copy(
    name: &str,
    weights: &HashMap<String, Tensor>,
    config: impl FnOnce(&mut serde_json::Value),
) -> tempfile::TempDir {
    let src = fixture_dir(name);
    let dir = tempfile::tempdir().unwrap();
    for f in ["generation_config.json", "reference.safetensors"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config(&mut json);
    std::fs::write(dir.path().join("config.json"), json.to_string()).unwrap();
    candle_core::safetensors::save(weights, dir.path().join("model.safetensors")).unwrap();
    dir
}

pub fn fp8_config(block: serde_json::Value) -> impl FnOnce(&mut serde_json::Value) {
    move |c| {
        c["quantization_config"] =
            serde_json::json!({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": block})
    }
}

/// tiny-llama in FP8 blocks of `block`, and the dense copy of the weights it dequantizes to.
pub fn fp8_and_dense(block: (usize, usize)) -> (tempfile::TempDir, tempfile::TempDir) {
    fixture_fp8_and_dense("tiny-llama", block)
}

/// Fixture `name` in FP8 blocks of `block`, and the dense copy of the weights it dequantizes to.
pub fn fixture_fp8_and_dense(name: &str, block: (usize, usize)) -> (tempfile::TempDir, tempfile::TempDir) {
    let weights = candle_core::safetensors::load(fixture_dir(name).join("model.safetensors"), &Device::Cpu).unwrap();
    let (mut fp8, mut dense) = (weights.clone(), weights.clone());
    for (name, w) in weights.iter().filter(|(n, _)| quantized_name(n)) {
        let (q, scales, dequantized) = quantize(w, block);
        fp8.insert(name.clone(), q);
        fp8.insert(format!("{name}_scale_inv"), scales);
        dense.insert(name.clone(), dequantized);
    }
    let config = fp8_config(serde_json::json!([block.0, block.1]));
    (fixture_copy(name, &fp8, config), fixture_copy(name, &dense, |_| {}))
}

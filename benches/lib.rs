//! Shared setup of the benchmarks: a random-weight model of the demo model's shape, and
//! random-weight copies of the demo models at a larger hidden size.

use candle_core::{DType, Device, Tensor};
use half::bf16;
use peagle_models::{load_target, LoadOptions, TargetModel};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::path::Path;

/// `criterion_main!` for one group, run on the kernels' thread pool as the engine runs its
/// steps (`peagle_kernels::on_pool`), so no op pays a hand-over to the pool.
#[macro_export]
macro_rules! main_on_pool {
    ($group:path) => {
        fn main() {
            peagle_kernels::on_pool($group);
            criterion::Criterion::default()
                .configure_from_args()
                .final_summary();
        }
    };
}

/// The demo model's architecture at hidden size `hidden` (the demo model's is 256): 12 layers,
/// heads of 64 with half as many key heads, a 3x MLP, vocab 8192, tied embeddings.
pub fn demo_config(hidden: usize) -> String {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "vocab_size": 8192, "hidden_size": hidden,
        "intermediate_size": 3 * hidden, "num_hidden_layers": 12,
        "num_attention_heads": hidden / 64, "num_key_value_heads": hidden / 128, "head_dim": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 1024,
        "tie_word_embeddings": true
    })
    .to_string()
}

/// The sizes of a Llama config that fix its weights' shapes.
struct Shape {
    vocab: usize,
    hidden: usize,
    intermediate: usize,
    layers: usize,
    /// Width of the query heads together, and of the key (or value) heads together.
    q: usize,
    kv: usize,
}

impl Shape {
    fn of(config: &str) -> Self {
        let cfg: serde_json::Value = serde_json::from_str(config).unwrap();
        let get = |k: &str| cfg[k].as_u64().unwrap() as usize;
        Self {
            vocab: get("vocab_size"),
            hidden: get("hidden_size"),
            intermediate: get("intermediate_size"),
            layers: get("num_hidden_layers"),
            q: get("num_attention_heads") * get("head_dim"),
            kv: get("num_key_value_heads") * get("head_dim"),
        }
    }
}

/// Writes random bf16 weights for `config` and loads them through the real loader.
pub fn random_model(config: &str) -> Box<dyn TargetModel> {
    let s = Shape::of(config);
    let (v, h, i, q, kv) = (s.vocab, s.hidden, s.intermediate, s.q, s.kv);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![v, h]),
        ("model.norm.weight".into(), vec![h]),
    ];
    for n in 0..s.layers {
        let p = format!("model.layers.{n}");
        for (name, shape) in [
            ("self_attn.q_proj.weight", vec![q, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, q]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            shapes.push((format!("{p}.{name}"), shape));
        }
    }
    let weights: HashMap<String, Tensor> = shapes
        .into_iter()
        .map(|(name, shape)| {
            let t = (Tensor::randn(0f32, 0.05, shape, &Device::Cpu).unwrap())
                .to_dtype(DType::BF16)
                .unwrap();
            (name, t)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    candle_core::safetensors::save(&weights, dir.path().join("model.safetensors")).unwrap();
    load_target(dir.path(), LoadOptions::default()).unwrap().model
}

/// Bytes of weights a decode step reads (every matrix once, bf16).
pub fn weight_bytes(config: &str) -> usize {
    let s = Shape::of(config);
    let layer = s.hidden * (s.q + 2 * s.kv) + s.q * s.hidden + 3 * s.hidden * s.intermediate;
    2 * (s.vocab * s.hidden + s.layers * layer)
}

/// The demo models' hidden size, which `widened_copy` scales from.
pub const DEMO_HIDDEN: usize = 256;
/// A hidden size at which the demo's target (320 MB in bf16) is far larger than the caches, so
/// that reading its weights bounds a decode step, as on a GPU.
pub const WIDE_HIDDEN: usize = 1024;

/// Copies the model or drafter in `src` to `dst` with hidden size `hidden` instead of the
/// demo's 256 and random weights, its architecture otherwise the same: every width scales
/// with the hidden size (heads of 64, half as many key heads, a 3x MLP, the drafter's 2x and
/// 3x inputs), the vocabularies and the draft vocabulary map stay. Its outputs are noise; it
/// times what a step of a model that size costs.
pub fn widened_copy(src: &Path, dst: &Path, hidden: usize) {
    std::fs::create_dir_all(dst).unwrap();
    let scale = |d: usize| match d {
        128 | 256 | 512 | 768 => d * hidden / DEMO_HIDDEN,
        other => other,
    };
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut widened: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in tensors.tensors() {
        if view.dtype() != Dtype::BF16 {
            widened.push((name, view.dtype(), view.shape().to_vec(), view.data().to_vec()));
            continue;
        }
        let shape: Vec<usize> = view.shape().iter().map(|d| scale(*d)).collect();
        let count: usize = shape.iter().product();
        // Norm weights of one keep activations at their scale through the layers.
        let is_norm = name.ends_with("norm.weight");
        let data: Vec<u8> = (0..count)
            .flat_map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let uniform = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                bf16::from_f32(if is_norm { 1.0 } else { 0.1 * uniform }).to_le_bytes()
            })
            .collect();
        widened.push((name, Dtype::BF16, shape, data));
    }
    let views: Vec<(String, TensorView)> = widened
        .iter()
        .map(|(name, dtype, shape, data)| (name.clone(), TensorView::new(*dtype, shape.clone(), data).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();

    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    let set_widths = |c: &mut serde_json::Value| {
        c["hidden_size"] = hidden.into();
        c["intermediate_size"] = (3 * hidden).into();
        c["num_attention_heads"] = (hidden / 64).into();
        c["num_key_value_heads"] = (hidden / 128).into();
    };
    match config.get_mut("transformer_layer_config") {
        Some(layers) => {
            set_widths(layers);
            config["target_hidden_size"] = hidden.into();
        }
        None => set_widths(&mut config),
    }
    std::fs::write(dst.join("config.json"), config.to_string()).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;
    use peagle_models::{BatchBuilder, Drafter, KvCache, Rows};

    #[test]
    fn widened_copies_load_at_the_new_width_and_run() {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
        let wide = tempfile::tempdir().unwrap();
        for name in ["pystdlib-12l", "pystdlib-12l-peagle", "pystdlib-12l-eagle3"] {
            widened_copy(&models.join(name), &wide.path().join(name), 512);
        }
        let target = load_target(&wide.path().join("pystdlib-12l"), LoadOptions::default())
            .unwrap()
            .model;
        let d = target.dims();
        let shape = (
            d.vocab_size,
            d.hidden_size,
            d.num_layers,
            d.num_heads,
            d.num_kv_heads,
            d.head_dim,
        );
        assert_eq!(shape, (8192, 512, 12, 8, 4, 64));
        for (name, layers) in [("pystdlib-12l-peagle", 4), ("pystdlib-12l-eagle3", 1)] {
            let drafter = Drafter::load(&wide.path().join(name), target.as_ref(), LoadOptions::default()).unwrap();
            assert_eq!(
                (drafter.dims().hidden_size, drafter.dims().num_layers),
                (512, layers),
                "{name}"
            );
        }

        let kv = KvCache::new(d, 1, 16, DType::BF16, target.device()).unwrap();
        let mut batch = BatchBuilder::new(16);
        batch.add(&[1, 2, 3], 0, &[0], Rows::Tail(1), Rows::None).unwrap();
        let logits = target.forward(&batch.build(), &kv).unwrap().logits;
        assert_eq!(logits.dims(), [1, 8192]);
        let values: Vec<f32> = logits.flatten_all().unwrap().to_vec1().unwrap();
        assert!(values.iter().all(|v| v.is_finite()));
    }
}

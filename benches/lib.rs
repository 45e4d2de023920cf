//! Shared setup of the benchmarks: a random-weight model of the demo model's shape.

use candle_core::{DType, Device, Tensor};
use peagle_models::{load_causal_lm, CausalLm, LoadOptions};
use std::collections::HashMap;

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

/// The demo model's shape: 12 layers, hidden 256, 4 heads of 64, 2 KV heads, vocab 8192.
pub const DEMO_CONFIG: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "vocab_size": 8192, "hidden_size": 256,
  "intermediate_size": 768, "num_hidden_layers": 12, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
  "max_position_embeddings": 1024, "tie_word_embeddings": true
}"#;

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
pub fn random_model(config: &str) -> CausalLm {
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
    load_causal_lm(dir.path(), LoadOptions::default()).unwrap().model
}

/// Bytes of weights a decode step reads (every matrix once, bf16).
pub fn weight_bytes(config: &str) -> usize {
    let s = Shape::of(config);
    let layer = s.hidden * (s.q + 2 * s.kv) + s.q * s.hidden + 3 * s.hidden * s.intermediate;
    2 * (s.vocab * s.hidden + s.layers * layer)
}

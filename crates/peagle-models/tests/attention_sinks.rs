//! Per-layer attention sinks (gpt-oss's `self_attn.sinks`): loaded as an attention option and
//! passed to paged attention. A sink of -inf is no sink; a sink far above every score takes
//! all of the softmax, leaving the heads' outputs at zero. Training's masked attention
//! refuses them.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{fixture_dir, BLOCK};
use peagle_models::layers::{Attention, AttentionContext, AttentionOptions, RotaryEmbedding};
use peagle_models::{BatchBuilder, Checkpoint, KvCache, LoadOptions, ModelDims, Rows, TextConfig};
use std::collections::HashMap;

const PREFIX: &str = "model.layers.0.self_attn";

/// Layer 0's attention of the tiny Llama fixture, with `sinks` (one per query head) when given.
fn attention(cfg: &TextConfig, sinks: Option<f32>) -> Attention {
    let dir = fixture_dir("tiny-llama");
    let file = Checkpoint::open(&dir, LoadOptions::default()).unwrap();
    let (heads, kv, d, h) = (
        cfg.num_attention_heads,
        cfg.num_kv_heads(),
        cfg.head_dim(),
        cfg.hidden_size,
    );
    let shapes = [
        ("q_proj", heads * d, h),
        ("k_proj", kv * d, h),
        ("v_proj", kv * d, h),
        ("o_proj", h, heads * d),
    ];
    let mut tensors: HashMap<String, Tensor> = shapes
        .iter()
        .map(|(name, out, inp)| {
            let name = format!("{PREFIX}.{name}.weight");
            let weight = file.matrix(&name, &[*out, *inp]).unwrap().to_dtype(DType::F32).unwrap();
            (name, weight)
        })
        .collect();
    if let Some(sink) = sinks {
        let values = Tensor::from_vec(vec![sink; heads], heads, &Device::Cpu).unwrap();
        tensors.insert(format!("{PREFIX}.sinks"), values);
    }
    let ckpt = Checkpoint::from_tensors(&dir, tensors, LoadOptions::default());
    let opts = AttentionOptions {
        sinks: sinks.is_some(),
        ..AttentionOptions::default()
    };
    Attention::load(&ckpt, PREFIX, cfg, h, opts).unwrap()
}

/// Five rows of one sequence through `attention` over a fresh paged cache.
fn run(cfg: &TextConfig, attention: &Attention) -> Vec<f32> {
    let rows = 5;
    let x = Tensor::arange(0u32, (rows * cfg.hidden_size) as u32, &Device::Cpu)
        .and_then(|t| t.to_dtype(DType::F32))
        .and_then(|t| t.affine(0.37, 0.0))
        .and_then(|t| t.sin())
        .and_then(|t| t.reshape((rows, cfg.hidden_size)))
        .unwrap();
    let dims = ModelDims::of(cfg);
    let kv = KvCache::new(&dims, 2, BLOCK, DType::F32, &Device::Cpu).unwrap();
    let mut batch = BatchBuilder::new(BLOCK);
    let tokens = vec![1; rows];
    batch.add(&tokens, 0, &[0], Rows::All, Rows::None).unwrap();
    let batch = batch.build();
    let rope = RotaryEmbedding::new(cfg.head_dim(), &cfg.rope().unwrap())
        .tables(&batch.positions, &Device::Cpu)
        .unwrap();
    let ctx = AttentionContext::Paged {
        kv: kv.layer(0),
        meta: &batch.attn,
    };
    let out = attention.forward(&x, &rope, &ctx).unwrap();
    out.flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn sinks_load_per_layer_and_join_the_softmax() {
    let cfg = TextConfig::from_file(&fixture_dir("tiny-llama").join("config.json")).unwrap();
    let plain = run(&cfg, &attention(&cfg, None));
    assert!(plain.iter().any(|v| v.abs() > 1e-3));
    assert_eq!(run(&cfg, &attention(&cfg, Some(f32::NEG_INFINITY))), plain);
    let swamped = run(&cfg, &attention(&cfg, Some(60.0)));
    assert!(swamped.iter().all(|v| v.abs() < 1e-12), "{swamped:?}");
    assert_ne!(run(&cfg, &attention(&cfg, Some(0.0))), plain);
}

#[test]
fn masked_attention_refuses_sinks() {
    let cfg = TextConfig::from_file(&fixture_dir("tiny-llama").join("config.json")).unwrap();
    let attention = attention(&cfg, Some(0.0));
    let x = Tensor::zeros((2, cfg.hidden_size), DType::F32, &Device::Cpu).unwrap();
    let rope = RotaryEmbedding::new(cfg.head_dim(), &cfg.rope().unwrap())
        .tables(&[0, 1], &Device::Cpu)
        .unwrap();
    let bias = Tensor::zeros((2, 2), DType::F32, &Device::Cpu).unwrap();
    let err = attention
        .forward(&x, &rope, &AttentionContext::Masked { bias: &bias })
        .unwrap_err();
    assert!(err.to_string().contains("attention sinks are not supported"), "{err}");
}

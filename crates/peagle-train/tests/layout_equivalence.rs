//! A P-EAGLE drafter gives the same logits for an (anchor, depth) element whether it runs in
//! the multi-depth training layout (masked attention) or in the inference layout (the anchor's
//! prefix, then mask slots, over the paged cache). Training and serving agree on the drafter.

use candle_core::{DType, Device, Tensor};
use peagle_models::{load_target, BatchBuilder, DraftHidden, Drafter, KvCache, LoadOptions, Rows};
use peagle_train::{CodConfig, CodLayout};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

#[test]
fn training_layout_logits_equal_inference_logits() {
    let target = load_target(&fixture("tiny-llama"), LoadOptions::default())
        .unwrap()
        .model;
    let drafter = Drafter::load(&fixture("tiny-llama-peagle"), target.as_ref(), LoadOptions::default()).unwrap();
    let (mask_token, mask_hidden) = drafter.parallel_inputs().unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let n = 24;
    // tokens[p + 1] is embedded at position p; aux rows stand in for captured target states.
    let tokens: Vec<u32> = (0..=n).map(|_| rng.random_range(2..380)).collect();
    let aux = Tensor::randn(0f32, 1.0, (n, mask_hidden.dim(1).unwrap()), &Device::Cpu).unwrap();
    let valid: Vec<bool> = (0..n).map(|p| p % 6 != 4).collect();
    let cfg = CodConfig {
        depths: 4,
        ratio: 0.8,
        ratio_min: 0.3,
    };
    let layout = CodLayout::sample(&valid, &vec![0; n], &cfg, &mut rng);
    assert!(
        layout.depth_counts().len() == 4,
        "every depth present: {:?}",
        layout.depth_counts()
    );

    let inputs = layout.inputs(&tokens[1..], &aux, mask_token, mask_hidden).unwrap();
    let hidden = DraftHidden::Target(inputs.hidden.clone());
    let training: Vec<Vec<f32>> = drafter
        .forward_masked(&inputs.tokens, &inputs.positions, &hidden, &inputs.bias)
        .unwrap()
        .logits
        .to_vec2()
        .unwrap();

    let mut compared = 0;
    for anchor in 0..n {
        let chain: Vec<usize> = (0..layout.len())
            .filter(|i| layout.elements[*i].anchor == anchor)
            .collect();
        let masks = chain.len() - 1;
        // Inference: depth-0 slots for positions 0..=anchor, then the chain's mask slots.
        let mut slots = tokens[1..=anchor + 1].to_vec();
        slots.extend(std::iter::repeat_n(mask_token, masks));
        let rows = Tensor::cat(
            &[
                aux.narrow(0, 0, anchor + 1).unwrap(),
                mask_hidden.repeat((masks, 1)).unwrap(),
            ],
            0,
        )
        .unwrap();
        let kv = KvCache::new(drafter.dims(), 4, 16, DType::F32, &Device::Cpu).unwrap();
        let mut batch = BatchBuilder::new(16);
        batch
            .add(&slots, 0, &[0, 1, 2, 3], Rows::Tail(masks + 1), Rows::None)
            .unwrap();
        let inference: Vec<Vec<f32>> = drafter
            .forward(&batch.build(), &DraftHidden::Target(rows), &kv)
            .unwrap()
            .logits
            .to_vec2()
            .unwrap();
        for (depth, element) in chain.iter().enumerate() {
            assert_eq!(layout.elements[*element].depth, depth);
            let diff = inference[depth]
                .iter()
                .zip(&training[*element])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-4, "anchor {anchor} depth {depth}: max abs diff {diff}");
            compared += 1;
        }
    }
    assert_eq!(compared, layout.len());
}

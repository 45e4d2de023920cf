//! A drafter exported by the trainer loads in peagle's loader with the same weights, the same
//! logits and the draft-to-target mapping, with the speculators config fields vLLM reads.

mod common;

use candle_core::{DType, Device, Tensor};
use common::{fixture, tiny_target};
use peagle_models::{DraftHidden, Drafter, LoadOptions};
use peagle_train::export::export;
use peagle_train::params::Params;
use peagle_train::{Algo, DraftVocab, DrafterBlueprint};
use serde_json::Value;

fn blueprint_of(algo: Algo, norm_before_residual: bool) -> DrafterBlueprint {
    let counts: Vec<i64> = (0..384).map(|t| (t * 7919 % 101) as i64).collect();
    let target_config: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tiny-llama/config.json")).unwrap()).unwrap();
    DrafterBlueprint {
        algo,
        num_layers: 2,
        vocab: DraftVocab::from_counts(&counts, 100),
        mask_token_id: (algo == Algo::Peagle).then_some(383),
        aux_layer_ids: vec![1, 2, 3],
        num_speculative_tokens: 5,
        norm_before_residual,
        target_dir: fixture("tiny-llama"),
        target_config,
    }
}

#[test]
fn exported_drafter_loads_with_equal_logits() {
    let target = tiny_target();
    for (algo, norm_before_residual) in [(Algo::Peagle, true), (Algo::Peagle, false), (Algo::Eagle3, true)] {
        let blueprint = blueprint_of(algo, norm_before_residual);
        let dir = tempfile::tempdir().unwrap();
        let config = blueprint.drafter_config(&dir.path().join("config.json")).unwrap();
        let params = Params::new(blueprint.init_weights(target.as_ref(), 4).unwrap()).unwrap();
        export(&blueprint, &params.snapshot(), dir.path(), DType::F32).unwrap();

        let loaded = Drafter::load(dir.path(), target.as_ref(), LoadOptions::default()).unwrap();
        let trained = params.frozen_drafter(&config, target.as_ref()).unwrap();
        assert_eq!(loaded.is_parallel(), algo == Algo::Peagle);
        let mapped: Vec<u32> = loaded.draft_to_target().to_vec1().unwrap();
        assert_eq!(
            mapped, blueprint.vocab.selected,
            "d2t maps each draft id to its target id"
        );
        if algo == Algo::Peagle {
            assert_eq!(loaded.parallel_inputs().unwrap().0, 383);
        }
        let rows = 6;
        let tokens: Vec<u32> = (0..rows as u32).map(|i| 5 + 31 * i).collect();
        let positions: Vec<u32> = (0..rows as u32).collect();
        let hidden = Tensor::randn(0f32, 1.0, (rows, 3 * 64), &Device::Cpu).unwrap();
        let causal: Vec<f32> = (0..rows * rows)
            .map(|i| if i % rows <= i / rows { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        let bias = Tensor::from_vec(causal, (rows, rows), &Device::Cpu).unwrap();
        let logits = |d: &Drafter| {
            d.forward_masked(&tokens, &positions, &DraftHidden::Target(hidden.clone()), &bias)
                .unwrap()
                .logits
                .to_vec2::<f32>()
                .unwrap()
        };
        assert_eq!(logits(&loaded), logits(&trained), "{algo:?}: same weights, same logits");

        let config: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
        let name = if algo == Algo::Peagle { "peagle" } else { "eagle3" };
        assert_eq!(config["speculators_model_type"], name);
        assert_eq!(config["speculators_config"]["algorithm"], name);
        assert_eq!(config["draft_vocab_size"], 100);
        assert_eq!(config["norm_before_residual"], norm_before_residual);
        assert_eq!(config["transformer_layer_config"]["num_hidden_layers"], 2);
        assert_eq!(config["eagle_aux_hidden_state_layer_ids"], serde_json::json!([1, 2, 3]));
        assert_eq!(
            config["speculators_config"]["proposal_methods"][0]["speculative_tokens"],
            5
        );
    }
}

/// `fit --init-from` checks a stored drafter against these shapes instead of making a random
/// drafter to compare with.
#[test]
fn weight_shapes_are_those_of_the_initial_weights() {
    let target = tiny_target();
    for algo in [Algo::Peagle, Algo::Eagle3] {
        let blueprint = blueprint_of(algo, true);
        let weights = blueprint.init_weights(target.as_ref(), 4).unwrap();
        let shapes: std::collections::BTreeMap<String, Vec<usize>> = weights
            .iter()
            .map(|(name, w)| (name.clone(), w.dims().to_vec()))
            .collect();
        assert_eq!(blueprint.weight_shapes().unwrap(), shapes, "{algo:?}");
    }
}

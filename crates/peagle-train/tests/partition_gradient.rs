//! Sequence partitioning changes memory, not the result: with --partitions 4 the summed
//! gradient equals the unpartitioned one.

mod common;

use candle_core::{Device, Tensor};
use common::{drafter_weights, fixture, identity_vocab, tiny_target};
use peagle_models::DrafterConfig;
use peagle_train::objective::Targets;
use peagle_train::params::Params;
use peagle_train::step::{peagle_sample, Gradients, PeagleSetup, Prepared};
use peagle_train::CodConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn four_partitions_give_the_unpartitioned_gradient() {
    let target = tiny_target();
    let config = DrafterConfig::from_file(&fixture("tiny-llama-peagle/config.json")).unwrap();
    let params = Params::new(drafter_weights("tiny-llama-peagle")).unwrap();
    let drafter = params.drafter(&config, target.as_ref()).unwrap();
    let vocab = identity_vocab(256);
    let mut rng = StdRng::seed_from_u64(11);
    let m = 41;
    let data = Prepared {
        next_tokens: (1..m).map(|_| rng.random_range(2..380)).collect(),
        aux: Tensor::randn(0f32, 1.0, (m - 1, 3 * 64), &Device::Cpu).unwrap(),
        valid: (0..m - 1).map(|p| p % 9 != 2 && p + 2 < m).collect(),
        targets: Targets::new(
            target.as_ref(),
            &Tensor::randn(0f32, 1.0, (m, 64), &Device::Cpu).unwrap(),
            &vocab,
        )
        .unwrap(),
    };
    let cod = CodConfig {
        depths: 5,
        ratio: 0.7,
        ratio_min: 0.2,
    };
    let gradients = |partitions: usize| {
        let setup = PeagleSetup {
            drafter: &drafter,
            vocab: &vocab,
            cod: &cod,
            partitions,
        };
        let mut grads = Gradients::new(&params);
        let stats = peagle_sample(
            &setup,
            &data,
            &mut StdRng::seed_from_u64(3),
            1.0,
            Some((&mut grads, &params)),
        )
        .unwrap();
        (grads, stats)
    };
    let (whole, whole_stats) = gradients(1);
    let (parts, parts_stats) = gradients(4);
    assert_eq!(whole_stats.count, parts_stats.count, "the same elements are trained");
    assert!((whole_stats.mean_loss() - parts_stats.mean_loss()).abs() < 1e-5);
    let mut compared = 0;
    for (i, name) in params.names.iter().enumerate() {
        let (a, b) = (whole.0[i].as_ref(), parts.0[i].as_ref());
        let (a, b) = (a.expect(name), b.expect(name));
        let diff = (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let size = a.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(size > 0.0, "{name} gets a gradient");
        assert!(
            diff <= 1e-5,
            "{name}: partitioned gradient differs by {diff} (magnitude {size})"
        );
        compared += 1;
    }
    assert!(compared > 20, "every weight compared ({compared})");
}

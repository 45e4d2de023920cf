//! Mixtures of dense bf16 experts (Qwen3-MoE; gpt-oss from a dense checkpoint): each expert
//! equal to the linear kernels it stands for, bit for bit; the block against the f64
//! reference; batch invariant in every tile form; fused into the next norm; and what they
//! refuse.
use super::experts_reference::{
    assert_every_tile_form_gives_the_same_bits, favouring_two, moe_reference, router_logits, ReferenceExpert, Rounding,
    TILE_FORM_ROWS,
};
use super::{bits, gpu, host, max_rel_diff, tensor, values};
use candle_core::{DType, Device, Tensor};
use peagle_kernels::{
    add_rms_norm, invariant_linear, invariant_linear_swiglu, DenseExpert, DenseExperts, MmaTiles, Routing,
};

/// An expert's bf16 weights and biases on the GPU: gate_up [2I, H] (gate rows first), its
/// bias, down [H, I], its bias.
struct Weights {
    gate_up: Tensor,
    gate_up_bias: Option<Tensor>,
    down: Tensor,
    down_bias: Option<Tensor>,
}

/// `num_experts` random experts of `hidden` x `inter` on `dev`, with biases or without.
fn random_experts(dev: &Device, num_experts: usize, hidden: usize, inter: usize, biases: bool) -> Vec<Weights> {
    let bf16 = |t: Tensor| t.to_dtype(DType::BF16).unwrap().to_device(dev).unwrap();
    let bias = |n: usize, seed: u64| biases.then(|| bf16(Tensor::new(values(n, seed, 0.5), &Device::Cpu).unwrap()));
    (0..num_experts as u64)
        .map(|e| Weights {
            gate_up: bf16(tensor((2 * inter, hidden), 10 * e, 0.25)),
            gate_up_bias: bias(2 * inter, 10 * e + 2),
            down: bf16(tensor((hidden, inter), 10 * e + 3, 0.25)),
            down_bias: bias(hidden, 10 * e + 5),
        })
        .collect()
}

fn borrowed(weights: &[Weights]) -> Vec<DenseExpert<'_>> {
    weights
        .iter()
        .map(|w| DenseExpert {
            gate_up: &w.gate_up,
            gate_up_bias: w.gate_up_bias.as_ref(),
            down: &w.down,
            down_bias: w.down_bias.as_ref(),
        })
        .collect()
}

/// The experts' weights as the f64 reference takes them (no bias is a zero one).
fn reference_experts(weights: &[Weights]) -> Vec<ReferenceExpert> {
    let bias = |b: &Option<Tensor>, n: usize| b.as_ref().map_or(vec![0.0; n], host);
    weights
        .iter()
        .map(|w| ReferenceExpert {
            gate_up: host(&w.gate_up),
            gate_up_bias: bias(&w.gate_up_bias, w.gate_up.dim(0).unwrap()),
            down: host(&w.down),
            down_bias: bias(&w.down_bias, w.down.dim(0).unwrap()),
        })
        .collect()
}

fn on(dev: &Device, t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16).unwrap().to_device(dev).unwrap()
}

/// gpt-oss's routing and gating (top 4, softmax over the chosen, clamped SwiGLU) with biases,
/// and Qwen3-MoE's without normalizing (top 2, plain SwiGLU) and without biases, each against
/// the f64 reference that rounds where a bf16 linear layer does; each row alone gives the
/// bits it gives among 40, and the outputs added to a residual and normed in one launch give
/// the bits of the block's output added and normed.
#[test]
fn dense_experts_match_the_reference_and_are_batch_invariant() {
    let Some(dev) = gpu() else { return };
    let gpt_oss = Routing {
        top_k: 4,
        normalize: true,
        clamp: Some((1.702, 7.0)),
    };
    let qwen = Routing {
        top_k: 2,
        normalize: false,
        clamp: None,
    };
    let rows = 40;
    for (num_experts, hidden, inter, routing, biases) in [(8, 256, 96, gpt_oss, true), (5, 64, 96, qwen, false)] {
        let what = format!("{num_experts} experts of {hidden}x{inter}, {routing:?}, biases {biases}");
        let weights = random_experts(&dev, num_experts, hidden, inter, biases);
        let experts = DenseExperts::new(&dev, &borrowed(&weights)).unwrap();
        let (x, logits) = (
            on(&dev, &tensor((rows, hidden), 7, 1.0)),
            on(&dev, &router_logits(rows, num_experts)),
        );
        let got = experts.forward(&x, &logits, &routing).unwrap();
        assert_eq!(got.dtype(), DType::BF16);
        let want = moe_reference(
            &host(&x),
            &host(&logits),
            &reference_experts(&weights),
            hidden,
            &routing,
            Rounding::Projections,
        );
        // What is left between them: a sum in f32 in another order than the f64 one, which
        // may round a projection's or an activation's bf16 the other way (one ulp of one term).
        let diff = max_rel_diff(&host(&got), &want);
        eprintln!("{what}: within {diff} of the reference");
        assert!(diff < 1e-2, "{what}: off by {diff}");
        for r in [0, 17, rows - 1] {
            let one = |t: &Tensor| t.narrow(0, r, 1).unwrap();
            let alone = experts.forward(&one(&x), &one(&logits), &routing).unwrap();
            assert_eq!(bits(&alone), bits(&one(&got)), "{what}: row {r} alone");
        }
        let residual = on(&dev, &tensor((rows, hidden), 11, 1.0));
        let norm_weight = on(&dev, &tensor((1, hidden), 9, 1.0).flatten_all().unwrap());
        let (want_sum, want_normed) = add_rms_norm(&got, &residual, &norm_weight, 1e-5).unwrap();
        let outputs = experts.outputs(&x, &logits, &routing).unwrap();
        let (sum, normed) = outputs.add_rms_norm(&residual, &norm_weight, 1e-5).unwrap();
        assert_eq!(bits(&sum), bits(&want_sum), "{what}: the sum");
        assert_eq!(bits(&normed), bits(&want_normed), "{what}: the norm");
    }
}

/// Each expert is its linear layers, bit for bit: with one expert a row (weight 1), a row's
/// output is its expert's down projection (`invariant_linear`) of the SwiGLU of its gate_up
/// projection (`invariant_linear_swiglu`), with and without biases. Row r goes to expert
/// r % 3 of 3; 20 rows make narrow tiles, and the same rows wide ones.
#[test]
fn dense_experts_are_their_linear_layers_bit_for_bit() {
    let Some(dev) = gpu() else { return };
    let routing = Routing {
        top_k: 1,
        normalize: true,
        clamp: None,
    };
    let (num_experts, hidden, inter, rows) = (3, 160, 64, 20);
    for biases in [false, true] {
        let weights = random_experts(&dev, num_experts, hidden, inter, biases);
        let experts = DenseExperts::new(&dev, &borrowed(&weights)).unwrap();
        let x = on(&dev, &tensor((rows, hidden), 7, 1.0));
        let scores: Vec<f32> = (0..rows * num_experts)
            .map(|i| {
                if i / num_experts % num_experts == i % num_experts {
                    5.0
                } else {
                    0.0
                }
            })
            .collect();
        let logits = on(
            &dev,
            &Tensor::from_vec(scores, (rows, num_experts), &Device::Cpu).unwrap(),
        );
        for tiles in [MmaTiles::Narrow, MmaTiles::Wide] {
            let got = experts.forward_tiled(&x, &logits, &routing, tiles).unwrap();
            for r in 0..rows {
                let w = &weights[r % num_experts];
                let row = x.narrow(0, r, 1).unwrap();
                let act =
                    invariant_linear_swiglu(&row, &w.gate_up, w.gate_up_bias.as_ref(), MmaTiles::ByBatch).unwrap();
                let want = invariant_linear(&act, &w.down, w.down_bias.as_ref(), None).unwrap();
                assert_eq!(
                    bits(&got.narrow(0, r, 1).unwrap()),
                    bits(&want),
                    "biases {biases}, {tiles:?}: row {r}"
                );
            }
        }
    }
}

/// A row gives the same bits in narrow tiles and in wide ones
/// (`assert_every_tile_form_gives_the_same_bits`).
#[test]
fn dense_experts_give_the_same_bits_in_wide_tiles_as_in_narrow_ones() {
    let Some(dev) = gpu() else { return };
    let routing = Routing {
        top_k: 4,
        normalize: true,
        clamp: Some((1.702, 7.0)),
    };
    let (num_experts, hidden, inter) = (8, 128, 96);
    let weights = random_experts(&dev, num_experts, hidden, inter, true);
    let experts = DenseExperts::new(&dev, &borrowed(&weights)).unwrap();
    let (x, logits) = (
        on(&dev, &tensor((TILE_FORM_ROWS, hidden), 7, 1.0)),
        on(&dev, &favouring_two(num_experts)),
    );
    assert_every_tile_form_gives_the_same_bits(|first, n, tiles| {
        let part = |t: &Tensor| t.narrow(0, first, n).unwrap();
        experts
            .forward_tiled(&part(&x), &part(&logits), &routing, tiles)
            .unwrap()
    });
}

/// What the kernels cannot run is refused with what is wrong: experts off the GPU, none,
/// f32 weights, biases on some experts only, widths off the tensor cores' steps, and f32 rows.
#[test]
fn dense_experts_refuse_what_they_cannot_run() {
    let err = |r: candle_core::Result<DenseExperts>| r.err().expect("refused").to_string();
    let cpu_weights = random_experts(&Device::Cpu, 2, 64, 32, false);
    let refused = err(DenseExperts::new(&Device::Cpu, &borrowed(&cpu_weights)));
    assert!(refused.contains("CUDA device"), "{refused}");
    let Some(dev) = gpu() else { return };
    assert!(err(DenseExperts::new(&dev, &[])).contains("no experts"));
    let weights = random_experts(&dev, 2, 64, 32, true);
    let f32_weight = weights[1].down.to_dtype(DType::F32).unwrap();
    let mut parts = borrowed(&weights);
    parts[1].down = &f32_weight;
    assert!(err(DenseExperts::new(&dev, &parts)).contains("bf16 weights"));
    let mut parts = borrowed(&weights);
    parts[1].down_bias = None;
    assert!(err(DenseExperts::new(&dev, &parts)).contains("some experts have biases"));
    let narrow = random_experts(&dev, 2, 48, 32, false);
    assert!(err(DenseExperts::new(&dev, &borrowed(&narrow))).contains("multiples of 32"));
    let experts = DenseExperts::new(&dev, &borrowed(&weights)).unwrap();
    let routing = Routing {
        top_k: 1,
        normalize: true,
        clamp: None,
    };
    let f32_rows = |t: Tensor| t.to_device(&dev).unwrap();
    let refused = experts
        .forward(
            &f32_rows(tensor((2, 64), 7, 1.0)),
            &f32_rows(tensor((2, 2), 8, 1.0)),
            &routing,
        )
        .expect_err("f32 rows refused")
        .to_string();
    assert!(refused.contains("bf16 rows"), "{refused}");
}

//! Mixtures of dense experts, bf16 or FP8 (Qwen3-MoE and its FP8 checkpoints; gpt-oss from a
//! dense checkpoint): each expert equal to the linear kernels it stands for, bit for bit; the block against the f64
//! reference; batch invariant in every tile form; fused into the next norm; and what they
//! refuse.
use super::experts_reference::{
    assert_every_tile_form_gives_the_same_bits, favouring_two, moe_reference, router_logits, ReferenceExpert, Rounding,
    TILE_FORM_ROWS,
};
use super::{bits, gpu, host, max_rel_diff, tensor, values};
use candle_core::{DType, Device, Tensor};
use float8::F8E4M3;
use peagle_kernels::{
    add_rms_norm, fp8_linear, invariant_linear, invariant_linear_swiglu, swiglu, DenseExpert, DenseExperts,
    ExpertMatrix, Fp8Weight, MmaTiles, Routing,
};

/// An expert's matrix on the GPU: bf16, or FP8 in blocks with their scales.
enum Matrix {
    Bf16(Tensor),
    Fp8(Fp8Weight),
}

impl Matrix {
    /// A random [rows, cols] matrix: values within 0.25, in FP8 blocks of `fp8` (their scales
    /// 0.5 to 1.5) or bf16.
    fn random(dev: &Device, (rows, cols): (usize, usize), seed: u64, fp8: Option<(usize, usize)>) -> Self {
        let Some((bn, bk)) = fp8 else {
            return Self::Bf16(on(dev, &tensor((rows, cols), seed, 0.25)));
        };
        let codes: Vec<F8E4M3> = values(rows * cols, seed, 0.25)
            .into_iter()
            .map(F8E4M3::from_f32)
            .collect();
        let scale_shape = (rows.div_ceil(bn), cols.div_ceil(bk));
        let scales: Vec<f32> = values(scale_shape.0 * scale_shape.1, seed + 1, 0.5)
            .iter()
            .map(|v| v + 1.0)
            .collect();
        let put = |t: Tensor| t.to_device(dev).unwrap();
        let weight = put(Tensor::from_vec(codes, (rows, cols), &Device::Cpu).unwrap());
        let scales = put(Tensor::from_vec(scales, scale_shape, &Device::Cpu).unwrap());
        Self::Fp8(Fp8Weight::new(weight, scales, (bn, bk)).unwrap())
    }

    fn borrowed(&self) -> ExpertMatrix<'_> {
        match self {
            Self::Bf16(w) => ExpertMatrix::Bf16(w),
            Self::Fp8(w) => ExpertMatrix::Fp8(w),
        }
    }

    /// The values the kernels multiply by, row-major in f32 on the host.
    fn values(&self) -> Vec<f32> {
        match self {
            Self::Bf16(w) => host(w),
            Self::Fp8(w) => host(&w.dequantize().unwrap()),
        }
    }

    fn rows(&self) -> usize {
        match self {
            Self::Bf16(w) => w.dim(0).unwrap(),
            Self::Fp8(w) => w.dims().0,
        }
    }

    /// `x` times this matrix, plus `bias`, by the linear kernels (FP8 ones take no bias).
    fn linear(&self, x: &Tensor, bias: Option<&Tensor>) -> Tensor {
        match self {
            Self::Bf16(w) => invariant_linear(x, w, bias, None).unwrap(),
            Self::Fp8(w) => fp8_linear(x, w).unwrap(),
        }
    }

    /// SwiGLU's gating of `linear` for a fused gate/up matrix.
    fn linear_swiglu(&self, x: &Tensor, bias: Option<&Tensor>) -> Tensor {
        match self {
            Self::Bf16(w) => invariant_linear_swiglu(x, w, bias, MmaTiles::ByBatch).unwrap(),
            Self::Fp8(_) => swiglu(&self.linear(x, bias)).unwrap(),
        }
    }
}

/// An expert's weights and biases on the GPU: gate_up [2I, H] (gate rows first), its bias,
/// down [H, I], its bias.
struct Weights {
    gate_up: Matrix,
    gate_up_bias: Option<Tensor>,
    down: Matrix,
    down_bias: Option<Tensor>,
}

/// `num_experts` random experts of `hidden` x `inter` on `dev`, with biases or without, in
/// FP8 blocks of `fp8` or bf16.
fn random_experts(
    dev: &Device,
    num_experts: usize,
    (hidden, inter): (usize, usize),
    biases: bool,
    fp8: Option<(usize, usize)>,
) -> Vec<Weights> {
    let bias = |n: usize, seed: u64| biases.then(|| on(dev, &Tensor::new(values(n, seed, 0.5), &Device::Cpu).unwrap()));
    (0..num_experts as u64)
        .map(|e| Weights {
            gate_up: Matrix::random(dev, (2 * inter, hidden), 10 * e, fp8),
            gate_up_bias: bias(2 * inter, 10 * e + 2),
            down: Matrix::random(dev, (hidden, inter), 10 * e + 3, fp8),
            down_bias: bias(hidden, 10 * e + 5),
        })
        .collect()
}

fn borrowed(weights: &[Weights]) -> Vec<DenseExpert<'_>> {
    weights
        .iter()
        .map(|w| DenseExpert {
            gate_up: w.gate_up.borrowed(),
            gate_up_bias: w.gate_up_bias.as_ref(),
            down: w.down.borrowed(),
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
            gate_up: w.gate_up.values(),
            gate_up_bias: bias(&w.gate_up_bias, w.gate_up.rows()),
            down: w.down.values(),
            down_bias: bias(&w.down_bias, w.down.rows()),
        })
        .collect()
}

fn on(dev: &Device, t: &Tensor) -> Tensor {
    t.to_dtype(DType::BF16).unwrap().to_device(dev).unwrap()
}

/// gpt-oss's routing and gating (top 4, softmax over the chosen, clamped SwiGLU) with biases,
/// and Qwen3-MoE's without normalizing (top 2, plain SwiGLU) and without biases, in bf16 and
/// in FP8 blocks (the reference over their scaled values), each against
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
    let cases = [
        (8, 256, 96, gpt_oss, true, None),
        (5, 64, 96, qwen, false, None),
        (8, 256, 96, qwen, false, Some((32, 64))),
    ];
    for (num_experts, hidden, inter, routing, biases, fp8) in cases {
        let what =
            format!("{num_experts} experts of {hidden}x{inter}, {routing:?}, biases {biases}, FP8 blocks {fp8:?}");
        let weights = random_experts(&dev, num_experts, (hidden, inter), biases, fp8);
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
/// output is its expert's down projection (`invariant_linear`, `fp8_linear`) of the SwiGLU of
/// its gate_up projection (`invariant_linear_swiglu`; `fp8_linear`, then `swiglu`): bf16 with
/// and without biases, and FP8 in blocks of two shapes, one of them short of the last block's
/// columns. Row r goes to expert r % 3 of 3; 20 rows make narrow tiles, and the same rows wide
/// ones.
#[test]
fn dense_experts_are_their_linear_layers_bit_for_bit() {
    let Some(dev) = gpu() else { return };
    let routing = Routing {
        top_k: 1,
        normalize: true,
        clamp: None,
    };
    let (num_experts, hidden, inter, rows) = (3, 160, 64, 20);
    for (biases, fp8) in [
        (false, None),
        (true, None),
        (false, Some((32, 32))),
        (false, Some((16, 64))),
    ] {
        let weights = random_experts(&dev, num_experts, (hidden, inter), biases, fp8);
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
                let act = w.gate_up.linear_swiglu(&row, w.gate_up_bias.as_ref());
                let want = w.down.linear(&act, w.down_bias.as_ref());
                assert_eq!(
                    bits(&got.narrow(0, r, 1).unwrap()),
                    bits(&want),
                    "biases {biases}, FP8 blocks {fp8:?}, {tiles:?}: row {r}"
                );
            }
        }
    }
}

/// A row gives the same bits in narrow tiles and in wide ones
/// (`assert_every_tile_form_gives_the_same_bits`), bf16 or FP8.
#[test]
fn dense_experts_give_the_same_bits_in_wide_tiles_as_in_narrow_ones() {
    let Some(dev) = gpu() else { return };
    let routing = Routing {
        top_k: 4,
        normalize: true,
        clamp: Some((1.702, 7.0)),
    };
    let (num_experts, hidden, inter) = (8, 128, 96);
    for (biases, fp8) in [(true, None), (false, Some((32, 32)))] {
        let weights = random_experts(&dev, num_experts, (hidden, inter), biases, fp8);
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
}

/// What the kernels cannot run is refused with what is wrong: experts off the GPU, none,
/// f32 weights, bf16 beside FP8, FP8 blocks narrower than a tensor-core step or not stacking,
/// biases on some experts only, widths off the tensor cores' steps, and f32 rows.
#[test]
fn dense_experts_refuse_what_they_cannot_run() {
    let err = |r: candle_core::Result<DenseExperts>| r.err().expect("refused").to_string();
    let cpu_weights = random_experts(&Device::Cpu, 2, (64, 32), false, None);
    let refused = err(DenseExperts::new(&Device::Cpu, &borrowed(&cpu_weights)));
    assert!(refused.contains("CUDA device"), "{refused}");
    let Some(dev) = gpu() else { return };
    assert!(err(DenseExperts::new(&dev, &[])).contains("no experts"));
    let weights = random_experts(&dev, 2, (64, 32), true, None);
    let refused_with = |parts: &[DenseExpert], what: &str| {
        let refused = err(DenseExperts::new(&dev, parts));
        assert!(refused.contains(what), "{refused}");
        assert!(!DenseExperts::takes(parts), "takes what it refuses: {refused}");
    };
    let f32_weight = match &weights[1].down {
        Matrix::Bf16(w) => w.to_dtype(DType::F32).unwrap(),
        Matrix::Fp8(_) => unreachable!("bf16 experts"),
    };
    let mut parts = borrowed(&weights);
    parts[1].down = ExpertMatrix::Bf16(&f32_weight);
    refused_with(&parts, "the tensor cores take bf16 or FP8");
    let fp8 = random_experts(&dev, 2, (64, 32), false, Some((32, 32)));
    let mut parts = borrowed(&weights);
    parts[1].down = fp8[1].down.borrowed();
    refused_with(&parts, "FP8 ones");
    for block in [(32, 16), (48, 32)] {
        refused_with(
            &borrowed(&random_experts(&dev, 2, (64, 32), false, Some(block))),
            "whole blocks of rows",
        );
    }
    let mut parts = borrowed(&weights);
    parts[1].down_bias = None;
    assert!(err(DenseExperts::new(&dev, &parts)).contains("some experts have biases"));
    let narrow = random_experts(&dev, 2, (48, 32), false, None);
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

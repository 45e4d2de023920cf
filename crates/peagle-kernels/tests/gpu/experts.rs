//! gpt-oss's MXFP4 mixture of experts: against an f64 reference, batch invariant in every tile
//! form, fused into the next norm, and routing rows of NaN.
use super::experts_reference::{
    assert_every_tile_form_gives_the_same_bits, favouring_two, moe_reference, router_logits, ReferenceExpert, Rounding,
    TILE_FORM_ROWS,
};
use super::{bits, gpu, host, max_rel_diff, tensor, values};
use candle_core::{DType, Device, Tensor};
use peagle_kernels::{add_rms_norm, CudaMatmul, MmaTiles, Mxfp4Expert, Mxfp4Experts, Mxfp4Weight, Routing};

/// A random MXFP4 weight [out, in]: every 4-bit code, scales around 2^-4.
fn mxfp4(out: usize, inner: usize, seed: u64) -> Mxfp4Weight {
    let groups = inner / 32;
    let bytes: Vec<u8> = values(out * groups * 16, seed, 1.0)
        .iter()
        .map(|v| ((v + 1.0) * 127.9) as u8)
        .collect();
    let scales: Vec<u8> = values(out * groups, seed + 1, 1.0)
        .iter()
        .map(|v| 121 + ((v + 1.0) * 2.0) as u8)
        .collect();
    Mxfp4Weight::new(
        &Tensor::from_vec(bytes, (out, groups, 16), &Device::Cpu).unwrap(),
        &Tensor::from_vec(scales, (out, groups), &Device::Cpu).unwrap(),
    )
    .unwrap()
}

/// An expert's gate_up weight and bias, then its down weight and bias.
type ExpertWeights = (Mxfp4Weight, Vec<f32>, Mxfp4Weight, Vec<f32>);

/// `num_experts` random MXFP4 experts of `hidden` x `inter`.
fn random_experts(num_experts: usize, hidden: usize, inter: usize) -> Vec<ExpertWeights> {
    (0..num_experts as u64)
        .map(|e| {
            (
                mxfp4(2 * inter, hidden, 10 * e),
                values(2 * inter, 10 * e + 2, 0.5),
                mxfp4(hidden, inter, 10 * e + 3),
                values(hidden, 10 * e + 5, 0.5),
            )
        })
        .collect()
}

fn borrowed(weights: &[ExpertWeights]) -> Vec<Mxfp4Expert<'_>> {
    weights
        .iter()
        .map(|(gate_up, gate_up_bias, down, down_bias)| Mxfp4Expert {
            gate_up,
            gate_up_bias,
            down,
            down_bias,
        })
        .collect()
}

/// The experts' weights dequantized, for the reference.
fn dense_experts(weights: &[ExpertWeights]) -> Vec<ReferenceExpert> {
    let dense = |w: &Mxfp4Weight| host(&w.dequantize(&Device::Cpu).unwrap());
    weights
        .iter()
        .map(|(gate_up, gate_up_bias, down, down_bias)| ReferenceExpert {
            gate_up: dense(gate_up),
            gate_up_bias: gate_up_bias.clone(),
            down: dense(down),
            down_bias: down_bias.clone(),
        })
        .collect()
}

/// gpt-oss's experts on the GPU (its 32 experts, top 4, widths 2880, clamped SwiGLU) and a
/// small block routed without normalising, against the f64 reference, in f32 and bf16; each
/// row alone gives the bits it gives among 64.
#[test]
fn mxfp4_experts_match_the_reference_and_are_batch_invariant() {
    let Some(dev) = gpu() else { return };
    let gpt_oss = Routing {
        top_k: 4,
        normalize: true,
        clamp: Some((1.702, 7.0)),
    };
    let plain = Routing {
        top_k: 2,
        normalize: false,
        clamp: None,
    };
    for (num_experts, hidden, inter, routing) in [(32, 2880, 2880, gpt_oss), (5, 64, 96, plain)] {
        let weights = random_experts(num_experts, hidden, inter);
        let on_gpu = Mxfp4Experts::new(&dev, &borrowed(&weights)).unwrap();
        let reference_weights = dense_experts(&weights);
        let rows = 64;
        let x = tensor((rows, hidden), 7, 1.0);
        let logits = router_logits(rows, num_experts);
        let what = format!("{num_experts} experts of {hidden}x{inter}, {routing:?}");
        let got = on_gpu
            .forward(&x.to_device(&dev).unwrap(), &logits.to_device(&dev).unwrap(), &routing)
            .unwrap();
        let want = moe_reference(
            &host(&x),
            &host(&logits),
            &reference_weights,
            hidden,
            &routing,
            Rounding::None,
        );
        // f32 sums 2880-long products twice, in another order than the f64 reference: an
        // output that cancels toward zero keeps an error of its terms' size, not its own.
        let diff = max_rel_diff(&host(&got), &want);
        eprintln!("{what}: f32 within {diff} of the reference");
        assert!(diff < 1e-3, "{what}: f32 off by {diff}");
        for r in [0, 17, 63] {
            let alone = on_gpu
                .forward(
                    &x.narrow(0, r, 1).unwrap().to_device(&dev).unwrap(),
                    &logits.narrow(0, r, 1).unwrap().to_device(&dev).unwrap(),
                    &routing,
                )
                .unwrap();
            assert_eq!(
                bits(&alone),
                bits(&got.narrow(0, r, 1).unwrap()),
                "{what}: row {r} alone"
            );
        }
        // bf16 rows by the CUDA cores and by the tensor cores, which also round the down
        // projection's inputs to bf16, an error of the size of the projection's terms, not of
        // its output where those cancel: so against a reference that rounds them too, where an
        // activation a few ulps from its f64 value may still round the other way. Each such
        // activation moves an output by one bf16 ulp of one term: at gpt-oss's clamp an
        // activation reaches 56, whose ulp is 0.25, times a weight of up to 1.5 here. Which
        // activations sit that near a tie is a draw that the order of the sums sets (0.015 and
        // 0.025 in two orders on the emulator), so the tolerance leaves room for a few; one
        // block of 32 terms lost or misscaled moves outputs by tenths, and the f32 rows above,
        // read in the same layout, are held to 1e-3. Each batch invariant.
        let b = |t: &Tensor| t.to_dtype(DType::BF16).unwrap().to_device(&dev).unwrap();
        let (xb, logits_b) = (b(&x), b(&logits));
        for (kernel, rounding, tolerance) in [
            (CudaMatmul::Fma, Rounding::None, 1e-2),
            (CudaMatmul::Mma, Rounding::Activations, 4e-2),
        ] {
            let want = moe_reference(
                &host(&xb),
                &host(&logits_b),
                &reference_weights,
                hidden,
                &routing,
                rounding,
            );
            let got = on_gpu.forward_by(&xb, &logits_b, &routing, kernel).unwrap();
            assert_eq!(got.dtype(), DType::BF16);
            let diff = max_rel_diff(&host(&got), &want);
            eprintln!("{what}: bf16 by {kernel:?} within {diff} of the reference");
            assert!(diff < tolerance, "{what}: bf16 by {kernel:?} off by {diff}");
            for r in [0, 17, 63] {
                let one = |t: &Tensor| t.narrow(0, r, 1).unwrap();
                let alone = on_gpu.forward_by(&one(&xb), &one(&logits_b), &routing, kernel).unwrap();
                assert_eq!(
                    bits(&alone),
                    bits(&one(&got)),
                    "{what}: bf16 by {kernel:?}, row {r} alone"
                );
            }
        }
    }
    let err = Mxfp4Experts::new(&Device::Cpu, &[]).err().unwrap();
    assert!(err.to_string().contains("CUDA device"), "{err}");
}

/// The tensor cores take tiles of 8 pairs of an expert, or of 32 (`moe_*_mma_wide`), by
/// default where a batch gives the average expert more than 8; a row gives the same bits
/// either way (`assert_every_tile_form_gives_the_same_bits`), and within bf16 of the reference.
#[test]
fn mxfp4_experts_give_the_same_bits_in_wide_tiles_as_in_narrow_ones() {
    let Some(dev) = gpu() else { return };
    let routing = Routing {
        top_k: 4,
        normalize: true,
        clamp: Some((1.702, 7.0)),
    };
    let (num_experts, hidden, inter, rows) = (8, 128, 96, TILE_FORM_ROWS);
    let weights = random_experts(num_experts, hidden, inter);
    let on_gpu = Mxfp4Experts::new(&dev, &borrowed(&weights)).unwrap();
    let b = |t: &Tensor| t.to_dtype(DType::BF16).unwrap().to_device(&dev).unwrap();
    let (xb, logits_b) = (b(&tensor((rows, hidden), 7, 1.0)), b(&favouring_two(num_experts)));
    let wide = assert_every_tile_form_gives_the_same_bits(|first, n, tiles| {
        let part = |t: &Tensor| t.narrow(0, first, n).unwrap();
        on_gpu
            .forward_tiled(&part(&xb), &part(&logits_b), &routing, CudaMatmul::Mma, tiles)
            .unwrap()
    });
    let want = moe_reference(
        &host(&xb),
        &host(&logits_b),
        &dense_experts(&weights),
        hidden,
        &routing,
        Rounding::Activations,
    );
    let diff = max_rel_diff(&host(&wide), &want);
    assert!(diff < 2e-2, "wide tiles off the reference by {diff}");
}

/// Narrow tiles load a warp's quads of the inner dimension three at a time, wide tiles one at
/// a time (kernels/moe_mxfp4_mma.cu's DEPTH); the mma run in quad order either way. At inner dimensions
/// of more quads than the 8 warps take in a round of three (98 blocks of 32: 25 quads, the last
/// of 2 blocks, for gate_up; 97 blocks: 25 quads, the last of one, for down), nine rows routed
/// to both of two experts (two narrow tiles an expert, one wide one) give the same bits in
/// either form, within bf16 of the reference, and the first and last rows alone (every row
/// alone is the batch-invariance tests'; this test's shapes make each launch long on the
/// emulator).
#[test]
fn mxfp4_experts_loaded_quads_deep_give_the_bits_of_one_at_a_time() {
    let Some(dev) = gpu() else { return };
    let routing = Routing {
        top_k: 2,
        normalize: true,
        clamp: Some((1.702, 7.0)),
    };
    let (num_experts, hidden, inter, rows) = (2, 98 * 32, 97 * 32, 9);
    let weights = random_experts(num_experts, hidden, inter);
    let on_gpu = Mxfp4Experts::new(&dev, &borrowed(&weights)).unwrap();
    let b = |t: &Tensor| t.to_dtype(DType::BF16).unwrap().to_device(&dev).unwrap();
    let (x, logits) = (b(&tensor((rows, hidden), 7, 1.0)), b(&router_logits(rows, num_experts)));
    let forward = |first: usize, n: usize, tiles: MmaTiles| {
        let part = |t: &Tensor| t.narrow(0, first, n).unwrap();
        on_gpu
            .forward_tiled(&part(&x), &part(&logits), &routing, CudaMatmul::Mma, tiles)
            .unwrap()
    };
    let narrow = forward(0, rows, MmaTiles::Narrow);
    let want = moe_reference(
        &host(&x),
        &host(&logits),
        &dense_experts(&weights),
        hidden,
        &routing,
        Rounding::Activations,
    );
    let diff = max_rel_diff(&host(&narrow), &want);
    assert!(diff < 2e-2, "narrow tiles off the reference by {diff}");
    assert_eq!(bits(&forward(0, rows, MmaTiles::Wide)), bits(&narrow), "wide tiles");
    for r in [0, rows - 1] {
        let alone = forward(r, 1, MmaTiles::Narrow);
        assert_eq!(bits(&alone), bits(&narrow.narrow(0, r, 1).unwrap()), "row {r} alone");
    }
}

/// The experts' outputs added to a residual and normed in one launch
/// (`ExpertOutputs::add_rms_norm`, as the norm after a gpt-oss block does) give the bits of the
/// block's output added and normed by `add_rms_norm`: f32 rows (CUDA cores), bf16 rows (tensor
/// cores) with a bf16 or an f32 weight, and a weight that starts off a 16-byte boundary (read
/// element by element); none of an empty batch.
#[test]
fn mxfp4_experts_added_and_normed_in_one_launch_equal_their_sum_added_then_normed() {
    let Some(dev) = gpu() else { return };
    let routing = Routing {
        top_k: 4,
        normalize: true,
        clamp: Some((1.702, 7.0)),
    };
    let (num_experts, hidden, inter, rows) = (8, 160, 96, 12);
    let weights = random_experts(num_experts, hidden, inter);
    let on_gpu = Mxfp4Experts::new(&dev, &borrowed(&weights)).unwrap();
    let on = |t: Tensor, dtype: DType| t.to_dtype(dtype).unwrap().to_device(&dev).unwrap();
    let norm_weight = tensor((1, hidden + 1), 9, 1.0).flatten_all().unwrap();
    for (dtype, w_dtype, offset) in [
        (DType::F32, DType::F32, 0),
        (DType::BF16, DType::BF16, 0),
        (DType::BF16, DType::F32, 0),
        (DType::BF16, DType::BF16, 1),
    ] {
        let what = format!("{dtype:?} rows, {w_dtype:?} weight at element {offset}");
        let x = on(tensor((rows, hidden), 7, 1.0), dtype);
        let logits = on(router_logits(rows, num_experts), dtype);
        let residual = on(tensor((rows, hidden), 11, 1.0), dtype);
        let weight = on(norm_weight.clone(), w_dtype).narrow(0, offset, hidden).unwrap();
        let (want_sum, want_normed) = add_rms_norm(
            &on_gpu.forward(&x, &logits, &routing).unwrap(),
            &residual,
            &weight,
            1e-5,
        )
        .unwrap();
        let outputs = on_gpu.outputs(&x, &logits, &routing).unwrap();
        let (sum, normed) = outputs.add_rms_norm(&residual, &weight, 1e-5).unwrap();
        assert_eq!(bits(&sum), bits(&want_sum), "{what}: the sum");
        assert_eq!(bits(&normed), bits(&want_normed), "{what}: the norm");
    }
    let none = |t: Tensor| on(t, DType::BF16).narrow(0, 0, 0).unwrap();
    let outputs = on_gpu
        .outputs(
            &none(tensor((1, hidden), 7, 1.0)),
            &none(router_logits(3, num_experts)),
            &routing,
        )
        .unwrap();
    let (sum, normed) = outputs
        .add_rms_norm(
            &none(tensor((1, hidden), 11, 1.0)),
            &on(norm_weight.narrow(0, 0, hidden).unwrap(), DType::BF16),
            1e-5,
        )
        .unwrap();
    assert_eq!((sum.dims(), normed.dims()), (&[0, hidden][..], &[0, hidden][..]));
}

/// A row whose router logits hold NaN (a model gone wrong) routes to valid experts, as the
/// CPU's sort does (NaN ranks above every number), and leaves its neighbours' bits alone.
#[test]
fn mxfp4_experts_route_a_row_of_nan_without_harm_to_the_rest() {
    let Some(dev) = gpu() else { return };
    let routing = Routing {
        top_k: 4,
        normalize: true,
        clamp: Some((1.702, 7.0)),
    };
    let (num_experts, hidden, inter) = (32, 64, 64);
    let weights = random_experts(num_experts, hidden, inter);
    let on_gpu = Mxfp4Experts::new(&dev, &borrowed(&weights)).unwrap();
    let x = tensor((2, hidden), 7, 1.0).to_device(&dev).unwrap();
    let mut scores = values(2 * num_experts, 8, 3.0);
    scores[3] = f32::NAN;
    scores[..num_experts].iter_mut().skip(10).for_each(|s| *s = f32::NAN);
    let logits = Tensor::from_vec(scores, (2, num_experts), &Device::Cpu).unwrap();
    let both = on_gpu.forward(&x, &logits.to_device(&dev).unwrap(), &routing).unwrap();
    let alone = on_gpu
        .forward(
            &x.narrow(0, 1, 1).unwrap(),
            &logits.narrow(0, 1, 1).unwrap().to_device(&dev).unwrap(),
            &routing,
        )
        .unwrap();
    assert_eq!(bits(&alone), bits(&both.narrow(0, 1, 1).unwrap()), "the row after NaN");
    assert!(
        host(&both.narrow(0, 0, 1).unwrap()).iter().all(|v| v.is_nan()),
        "NaN weights"
    );
}

/// Every e2m1 code at every scale (0, the subnormal 2^-127, to 255, infinity) dequantizes on
/// the GPU to the CPU's value, by both kernels: expert e's activations are one-hot at column e
/// (its gate_up weights are zeros, and its biases make SwiGLU 1 there, 0 elsewhere), so its
/// output is column e of its down projection, whose row r has scale r and code (r + e) % 16
/// there, and code 0 elsewhere. Sixteen experts, each a row's only one, see all 4096 pairs.
#[test]
fn mxfp4_experts_dequantize_every_code_at_every_scale_as_the_cpu() {
    let Some(dev) = gpu() else { return };
    let (experts, hidden, inter) = (16, 256, 32);
    // An MXFP4 weight of `out` rows one block wide, its codes and its rows' scales given.
    let block_wide = |out: usize, code: &dyn Fn(usize, usize) -> u8, scale: &dyn Fn(usize) -> u8| {
        let bytes: Vec<u8> = (0..out * 16)
            .map(|i| code(i / 16, 2 * (i % 16)) | code(i / 16, 2 * (i % 16) + 1) << 4)
            .collect();
        let scales: Vec<u8> = (0..out).map(scale).collect();
        Mxfp4Weight::new(
            &Tensor::from_vec(bytes, (out, 1, 16), &Device::Cpu).unwrap(),
            &Tensor::from_vec(scales, (out, 1), &Device::Cpu).unwrap(),
        )
        .unwrap()
    };
    let zeros = |out: usize, inner: usize| {
        Mxfp4Weight::new(
            &Tensor::zeros((out, inner / 32, 16), DType::U8, &Device::Cpu).unwrap(),
            &Tensor::full(127u8, (out, inner / 32), &Device::Cpu).unwrap(),
        )
        .unwrap()
    };
    let weights: Vec<ExpertWeights> = (0..experts)
        .map(|e| {
            let gate_up_bias = (0..2 * inter)
                .map(|c| match c {
                    c if c == e => 64.0,
                    c if c < inter => 0.0,
                    _ => 1.0 / 64.0,
                })
                .collect();
            let code = move |r: usize, c: usize| if c == e { ((r + e) % 16) as u8 } else { 0 };
            let down = block_wide(hidden, &code, &|r| r as u8);
            (zeros(2 * inter, hidden), gate_up_bias, down, vec![0.0; hidden])
        })
        .collect();
    let on_gpu = Mxfp4Experts::new(&dev, &borrowed(&weights)).unwrap();
    let routing = Routing {
        top_k: 1,
        normalize: true,
        clamp: None,
    };
    // Row e routes to expert e alone, with weight 1.
    let logits = Tensor::from_vec(
        (0..experts * experts)
            .map(|i| if i / experts == i % experts { 10.0 } else { 0.0 })
            .collect(),
        (experts, experts),
        &Device::Cpu,
    )
    .unwrap();
    // Row e of the output: the f32 dot of the CPU's dequantized down weights and the one-hot
    // activations, so a row with an infinite weight elsewhere is NaN there too.
    let want: Vec<f32> = weights
        .iter()
        .enumerate()
        .flat_map(|(e, (_, _, down, _))| {
            let dense = host(&down.dequantize(&Device::Cpu).unwrap());
            (0..hidden)
                .map(|r| {
                    (0..inter).fold(0f32, |sum, c| {
                        sum + dense[r * inter + c] * if c == e { 1.0 } else { 0.0 }
                    })
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let same = |got: f32, want: f32| got == want || (got.is_nan() && want.is_nan());
    for (dtype, kernel) in [
        (DType::F32, CudaMatmul::Fma),
        (DType::BF16, CudaMatmul::Fma),
        (DType::BF16, CudaMatmul::Mma),
    ] {
        let x = Tensor::zeros((experts, hidden), dtype, &dev).unwrap();
        let logits = logits.to_dtype(dtype).unwrap().to_device(&dev).unwrap();
        let got = host(&on_gpu.forward_by(&x, &logits, &routing, kernel).unwrap());
        let wrong: Vec<_> = (0..experts * hidden)
            .filter(|i| !same(got[*i], want[*i]))
            .map(|i| (i / hidden, i % hidden, got[i], want[i]))
            .take(5)
            .collect();
        assert!(
            wrong.is_empty(),
            "{dtype:?} by {kernel:?}: (expert, scale, got, want) {wrong:?}"
        );
    }
}

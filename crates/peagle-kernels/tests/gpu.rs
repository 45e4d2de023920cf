//! Every CUDA kernel against its CPU reference, the batch invariance of the GPU path, and the
//! accounting of the memory the device's pool keeps.
//! Built with the `cuda` feature only and run by scripts/gpu_check.sh on a GPU host; without a
//! GPU each test says so and passes, so a CUDA build's tests can run anywhere.
#![cfg(feature = "cuda")]

mod common;
use candle_core::{DType, Device, Tensor};
use common::{chi_square, draws_of_one_row};
use peagle_kernels::{
    add_rms_norm, argmax_rows, device_memory, fp8_linear, gumbel_sample, invariant_linear, invariant_matmul,
    invariant_matmul_by, invariant_matmul_tiled, keep_freed_memory, paged_attention, rms_norm, rms_norm_pair, rope,
    rotated_paged_attention, row_candidates, swiglu, write_kv, write_rotated_kv, AttentionMetadata, AttentionParams,
    CandidateRequest, CudaMatmul, Fp8Weight, GumbelRequest, KvScale, MmaTiles, Mxfp4Expert, Mxfp4Experts, Mxfp4Weight,
    Rotation, Routing, RowCandidates, Sinks, MAX_ROW_CANDIDATES, PAD_SLOT,
};

fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// With the pool keeping what is freed for later allocations (`keep_freed_memory`, as a
/// serving process has it), a freed 256 MiB stays in the pool, and `device_memory` still
/// counts it as free: the KV cache is sized by it.
#[test]
fn memory_the_pool_keeps_counts_as_free() {
    let Some(dev) = gpu() else { return };
    keep_freed_memory(&dev).unwrap();
    let free = || device_memory(&dev).unwrap().unwrap().free;
    let before = free();
    drop(Tensor::zeros(256 << 20, DType::U8, &dev).unwrap());
    let after = free();
    assert!(
        before.abs_diff(after) < 32 << 20,
        "{before} bytes free before a freed allocation, {after} after"
    );
}

/// Deterministic values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn tensor(shape: (usize, usize), seed: u64, scale: f32) -> Tensor {
    Tensor::from_vec(values(shape.0 * shape.1, seed, scale), shape, &Device::Cpu).unwrap()
}

/// The elements widened to f32 on the host (which converts FP8 on any GPU).
fn host(t: &Tensor) -> Vec<f32> {
    t.to_device(&Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    host(t).into_iter().map(f32::to_bits).collect()
}

fn max_rel_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0.0, f32::max)
}

#[test]
fn invariant_matmul_equals_its_cpu_reference_bitwise_at_every_batch_size() {
    let Some(dev) = gpu() else { return };
    // The CUDA-core kernel, whatever PEAGLE_CUDA_MATMUL chooses for the process.
    let invariant_matmul = |x: &Tensor, w: &Tensor| invariant_matmul_by(x, w, CudaMatmul::Fma);
    let (n, k) = (72, 1032);
    let w = tensor((n, k), 1, 0.1);
    let bias = tensor((1, n), 5, 1.0).flatten_all().unwrap();
    // M = 1 takes one form of the kernel (`_row`), 2 to 8 another, more the `_wide` one: 1, 3,
    // 8, 9 and 13 cross the lines.
    for m in [1, 3, 8, 9, 13, 64, 256, 2048] {
        let x = tensor((m, k), 2 + m as u64, 1.0);
        let want = invariant_matmul(&x, &w).unwrap();
        let x_gpu = x.to_device(&dev).unwrap();
        let got = invariant_matmul(&x_gpu, &w.to_device(&dev).unwrap()).unwrap();
        assert_eq!(bits(&got), bits(&want), "f32, M = {m}");
        // bf16 weights and activations: the reference on the same (exactly widened) values,
        // rounded once at the end as the kernel does.
        let (xb, wb) = (x.to_dtype(DType::BF16).unwrap(), w.to_dtype(DType::BF16).unwrap());
        let want = invariant_matmul(&xb.to_dtype(DType::F32).unwrap(), &wb.to_dtype(DType::F32).unwrap())
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let got = invariant_matmul(&xb.to_device(&dev).unwrap(), &wb.to_device(&dev).unwrap()).unwrap();
        assert_eq!(bits(&got), bits(&want), "bf16, M = {m}");
        // f32 activations with bf16 weights.
        let got = invariant_matmul(&x_gpu, &wb.to_device(&dev).unwrap()).unwrap();
        let want = invariant_matmul(&x, &wb.to_dtype(DType::F32).unwrap()).unwrap();
        assert_eq!(bits(&got), bits(&want), "f32 x bf16, M = {m}");
        // A bias, added in the same launch to each f32 sum before its one rounding: the
        // reference adds it to its f32 sum.
        let biased = |x: &Tensor, w: &Tensor, b: &Tensor| invariant_linear(x, w, Some(b), Some(CudaMatmul::Fma));
        let g = |t: &Tensor| t.to_device(&dev).unwrap();
        let want = biased(&x, &w, &bias).unwrap();
        assert_eq!(
            bits(&biased(&x_gpu, &g(&w), &g(&bias)).unwrap()),
            bits(&want),
            "f32 with a bias, M = {m}"
        );
        let bb = bias.to_dtype(DType::BF16).unwrap();
        let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        let want = biased(&f(&xb), &f(&wb), &f(&bb))
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        let got = biased(&g(&xb), &g(&wb), &g(&bb)).unwrap();
        assert_eq!(bits(&got), bits(&want), "bf16 with a bias, M = {m}");
    }
    let x = tensor((4, 12), 3, 1.0).to_device(&dev).unwrap();
    let err = invariant_matmul(&x, &tensor((2, 12), 4, 1.0).to_device(&dev).unwrap()).unwrap_err();
    assert!(err.to_string().contains("8 at a time"), "{err}");
}

/// The tensor-core matmul (the default, `mma`) gives a row the same bits at every batch
/// size, from 1 (its narrow form) to 2048 (its wide one), wherever the row sits and in either
/// form asked for; its values are the product's within bf16 rounding. Products it does not take (K not a multiple
/// of 32, f32 activations) are the CUDA-core kernel's, bit for bit.
#[test]
fn tensor_core_matmul_is_batch_invariant_and_within_bf16_of_the_product() {
    let Some(dev) = gpu() else { return };
    // N not a multiple of a block's columns, nor M of its rows.
    let (n, k) = (72, 1056);
    let bf16 = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
    let w = bf16(tensor((n, k), 1, 0.1));
    let x = bf16(tensor((2048, k), 2, 1.0));
    let (wg, xg) = (w.to_device(&dev).unwrap(), x.to_device(&dev).unwrap());
    let mma = |x: &Tensor, w: &Tensor| invariant_matmul_by(x, w, CudaMatmul::Mma).unwrap();
    let all = bits(&mma(&xg, &wg));
    for m in [1, 3, 8, 9, 13, 64, 256] {
        let got = bits(&mma(&xg.narrow(0, 0, m).unwrap(), &wg));
        assert_eq!(got, all[..m * n], "the first {m} rows");
    }
    let alone = bits(&mma(&xg.narrow(0, 777, 1).unwrap(), &wg));
    assert_eq!(alone, all[777 * n..778 * n], "row 777 alone");
    // Either form at any batch size, against the form its size picks.
    for (m, tiles) in [(300, MmaTiles::Narrow), (5, MmaTiles::Wide)] {
        let x = xg.narrow(0, 0, m).unwrap();
        let got = bits(&invariant_matmul_tiled(&x, &wg, CudaMatmul::Mma, tiles).unwrap());
        assert_eq!(got, all[..m * n], "{m} rows in {tiles:?} tiles");
    }
    // With a bias, added to each f32 sum before its rounding.
    let bias = bf16(tensor((1, n), 6, 1.0).flatten_all().unwrap());
    let biased = |x: &Tensor| {
        bits(&invariant_linear(x, &wg, Some(&bias.to_device(&dev).unwrap()), Some(CudaMatmul::Mma)).unwrap())
    };
    let all_biased = biased(&xg);
    for m in [1, 9] {
        assert_eq!(
            biased(&xg.narrow(0, 0, m).unwrap()),
            all_biased[..m * n],
            "the first {m} rows, a bias"
        );
    }
    let widened = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let want = invariant_matmul(&widened(&x.narrow(0, 0, 300).unwrap()), &widened(&w)).unwrap();
    let diff = max_rel_diff(&host(&mma(&xg.narrow(0, 0, 300).unwrap(), &wg)), &host(&want));
    assert!(diff < 1e-2, "against the f32 product: {diff}");

    let odd_k = bf16(tensor((n, 1032), 3, 0.1)).to_device(&dev).unwrap();
    let x_odd = bf16(tensor((9, 1032), 4, 1.0)).to_device(&dev).unwrap();
    let fma = |x: &Tensor, w: &Tensor| bits(&invariant_matmul_by(x, w, CudaMatmul::Fma).unwrap());
    assert_eq!(bits(&mma(&x_odd, &odd_k)), fma(&x_odd, &odd_k), "K = 1032");
    let x32 = widened(&x.narrow(0, 0, 9).unwrap()).to_device(&dev).unwrap();
    assert_eq!(bits(&mma(&x32, &wg)), fma(&x32, &wg), "f32 activations");
}

/// A block-scaled FP8 weight's product is the batch-invariant matmul of its dequantized f32
/// weight, bit for bit, at every batch size; with bf16 rows, within bf16 of the CPU's.
#[test]
fn fp8_linear_is_the_invariant_matmul_of_its_dequantized_weight() {
    let Some(dev) = gpu() else { return };
    // Blocks of 128 x 128, as FP8 checkpoints have them, over a shape they do not divide.
    let (n, k, block) = (200, 1032, (128, 128));
    let weight = tensor((n, k), 20, 300.0).to_dtype(DType::F8E4M3).unwrap();
    let scales = tensor((2, 9), 21, 1.0).abs().unwrap().affine(1e-3, 1e-4).unwrap();
    let cpu_weight = Fp8Weight::new(weight.clone(), scales.clone(), block).unwrap();
    let gpu_weight = Fp8Weight::new(weight.to_device(&dev).unwrap(), scales.to_device(&dev).unwrap(), block).unwrap();
    let dense = cpu_weight.dequantize().unwrap().to_device(&dev).unwrap();
    for m in [1, 8, 64, 256] {
        let x = tensor((m, k), 22 + m as u64, 1.0);
        let got = fp8_linear(&x.to_device(&dev).unwrap(), &gpu_weight).unwrap();
        let want = invariant_matmul(&x.to_device(&dev).unwrap(), &dense).unwrap();
        assert_eq!(bits(&got), bits(&want), "f32, M = {m}");
        let cpu = fp8_linear(&x, &cpu_weight).unwrap();
        let diff = max_rel_diff(&host(&got), &host(&cpu));
        assert!(diff < 1e-4, "f32 against the CPU, M = {m}: {diff}");
        let xb = x.to_dtype(DType::BF16).unwrap();
        let got = fp8_linear(&xb.to_device(&dev).unwrap(), &gpu_weight).unwrap();
        assert_eq!(got.dtype(), DType::BF16);
        let want = fp8_linear(&xb.to_dtype(DType::F32).unwrap(), &cpu_weight).unwrap();
        let diff = max_rel_diff(&host(&got), &host(&want));
        assert!(diff < 1e-2, "bf16, M = {m}: {diff}");
    }
}

/// Each requested row's argmax on the GPU is the CPU's (the first largest, NaN never), at a
/// gpt-oss-sized vocabulary (read eight logits a load) and at one a little smaller that is no
/// multiple of 8 (read one at a time), with ties and NaN planted, in f32 and bf16, for every
/// row (which uploads no list of rows) and for a few in another order.
#[test]
fn argmax_rows_equals_the_cpu() {
    let Some(dev) = gpu() else { return };
    for (rows, vocab) in [(37, 201_088), (31, 201_085)] {
        let mut v = values(rows * vocab, 30, 4.0);
        for r in 0..rows {
            let row = &mut v[r * vocab..][..vocab];
            row[(r * 7919) % vocab] = 9.0;
            if r % 3 == 0 {
                row[(r * 104_729) % vocab] = 9.0;
            }
            if r % 5 == 0 {
                row[r] = f32::NAN;
            }
        }
        let x = Tensor::from_vec(v, (rows, vocab), &Device::Cpu).unwrap();
        let xb = x.to_dtype(DType::BF16).unwrap();
        let every: Vec<u32> = (0..rows as u32).collect();
        for chosen in [every, vec![30, 3, 30, 0, 27]] {
            let want = argmax_rows(&x, &chosen).unwrap();
            assert_eq!(
                argmax_rows(&x.to_device(&dev).unwrap(), &chosen).unwrap(),
                want,
                "f32, vocabulary {vocab}"
            );
            let want = argmax_rows(&xb.to_dtype(DType::F32).unwrap(), &chosen).unwrap();
            assert_eq!(
                argmax_rows(&xb.to_device(&dev).unwrap(), &chosen).unwrap(),
                want,
                "bf16, vocabulary {vocab}"
            );
        }
    }
}

/// Rows with what sampling's order meets: a gpt-oss-sized vocabulary, many equal logits
/// (quarter steps in bf16), -inf, and -0.0 beside 0.0.
fn sampling_rows(rows: usize, vocab: usize) -> Tensor {
    let mut v = values(rows * vocab, 31, 6.0);
    for r in 0..rows {
        let row = &mut v[r * vocab..][..vocab];
        match r % 3 {
            0 => row.iter_mut().for_each(|x| *x = (*x * 4.0).round() / 4.0),
            1 => row.iter_mut().step_by(5).for_each(|x| *x = f32::NEG_INFINITY),
            _ => row
                .iter_mut()
                .step_by(7)
                .for_each(|x| *x = if *x > 0.0 { 0.0 } else { -0.0 }),
        }
    }
    Tensor::from_vec(v, (rows, vocab), &Device::Cpu).unwrap()
}

/// The GPU's first tokens are the CPU's, in order, with their logits' bits; the rest's sums
/// agree within what the cut's bracket allows for (2 ulps of f32 a weight, any order).
#[test]
fn row_candidates_equal_the_cpu() {
    let Some(dev) = gpu() else { return };
    for vocab in [1000, 201_088] {
        let x = sampling_rows(9, vocab);
        for dtype in [DType::F32, DType::BF16] {
            let x = x.to_dtype(dtype).unwrap();
            let on_gpu = x.to_device(&dev).unwrap();
            for count in [1, 64, 256, MAX_ROW_CANDIDATES] {
                let requests: Vec<CandidateRequest> = [8, 0, 3, 3, 5, 1, 7]
                    .into_iter()
                    .enumerate()
                    .map(|(i, row)| CandidateRequest {
                        row,
                        temperature: [0.3, 1.0, 2.0][i % 3],
                        lo: [0.0, 1e-3, 0.2][i % 3],
                        hi: [0.0, 2e-3, 0.5][i % 3],
                    })
                    .collect();
                let want = row_candidates(&x, &requests, count).unwrap();
                let got = row_candidates(&on_gpu, &requests, count).unwrap();
                for (g, w) in got.iter().zip(&want) {
                    let bits = |c: &RowCandidates| c.first.iter().map(|(t, l)| (*t, l.to_bits())).collect::<Vec<_>>();
                    assert_eq!(bits(g), bits(w), "{dtype:?}, vocab {vocab}, count {count}");
                    for (gs, ws) in [(g.above, w.above), (g.between, w.between)] {
                        let allowed = ws * (4.0 * f32::EPSILON as f64 + 4.0 * vocab as f64 * f64::EPSILON) + 1e-30;
                        assert!((gs - ws).abs() <= allowed, "{gs} vs {ws}: {dtype:?}, vocab {vocab}");
                    }
                }
            }
        }
    }
}

/// The GPU's Gumbel-max draws are the CPU's, for rows dealt to blocks in 4096-logit chunks
/// (gpt-oss's vocabulary, a last chunk part full; the demo's, two full chunks) and in one,
/// and over many keys they follow the tempered softmax (a chi-square test at the 0.1% level,
/// over the 16 likeliest tokens and the rest).
#[test]
fn gumbel_sample_equals_the_cpu_and_follows_the_softmax() {
    let Some(dev) = gpu() else { return };
    for (rows, vocab) in [(6, 201_088), (5, 8_192)] {
        let x = sampling_rows(rows, vocab);
        for dtype in [DType::F32, DType::BF16] {
            let x = x.to_dtype(dtype).unwrap();
            let requests: Vec<GumbelRequest> = (0..600)
                .map(|i| GumbelRequest {
                    row: i % rows,
                    temperature: [0.5, 1.0, 1.7][i % 3],
                    key: i as u64 * 7 + 1,
                })
                .collect();
            let want = gumbel_sample(&x, &requests).unwrap();
            assert_eq!(
                gumbel_sample(&x.to_device(&dev).unwrap(), &requests).unwrap(),
                want,
                "{dtype:?}, vocabulary {vocab}"
            );
        }
    }

    // A row with +inf logits draws among them on both.
    let mut infinite = values(64, 33, 3.0);
    infinite[5] = f32::INFINITY;
    infinite[40] = f32::INFINITY;
    let x = Tensor::from_vec(infinite, (1, 64), &Device::Cpu).unwrap();
    let requests = draws_of_one_row(1.0, 200);
    let want = gumbel_sample(&x, &requests).unwrap();
    assert!(want.iter().all(|t| *t == 5 || *t == 40), "{want:?}");
    assert_eq!(
        gumbel_sample(&x.to_device(&dev).unwrap(), &requests).unwrap(),
        want,
        "+inf"
    );

    let row = values(256, 32, 3.0);
    let temperature = 0.7;
    let x = Tensor::from_vec(row.clone(), (1, 256), &dev).unwrap();
    let requests = draws_of_one_row(temperature, 50_000);
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = row.iter().map(|l| (((l - max) / temperature) as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut order: Vec<usize> = (0..256).collect();
    order.sort_by(|a, b| weights[*b].total_cmp(&weights[*a]));
    let mut bins = vec![0usize; 17];
    for token in gumbel_sample(&x, &requests).unwrap() {
        let rank = order.iter().position(|t| *t == token as usize).unwrap();
        bins[rank.min(16)] += 1;
    }
    let mut expected: Vec<f64> = order[..16].iter().map(|t| weights[*t] / total).collect();
    expected.push(1.0 - expected.iter().sum::<f64>());
    let chi_square = chi_square(&bins, &expected);
    // The 99.9th percentile of chi-square with 16 degrees of freedom.
    assert!(chi_square < 39.25, "chi-square {chi_square}: {bins:?}");
}

#[test]
fn rope_equals_the_cpu_kernel_bitwise_even_on_strided_rows() {
    let Some(dev) = gpu() else { return };
    // 384 pairs a row: three blocks of it.
    let (rows, heads, d) = (9, 12, 64);
    let wide = tensor((rows, 3 * heads * d), 5, 2.0);
    let angles = tensor((rows, d / 2), 6, 3.0);
    let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
    let x = wide.narrow(1, heads * d, heads * d).unwrap();
    let want = rope(&x, &cos, &sin, d).unwrap();
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    let got = rope(
        &g(&wide).narrow(1, heads * d, heads * d).unwrap(),
        &g(&cos),
        &g(&sin),
        d,
    )
    .unwrap();
    assert_eq!(bits(&got), bits(&want));
    let got = rope(&g(&x.to_dtype(DType::BF16).unwrap()), &g(&cos), &g(&sin), d).unwrap();
    assert_eq!(got.dtype(), DType::BF16);
    assert!(max_rel_diff(&host(&got), &host(&want)) < 2e-2);
}

#[test]
fn swiglu_and_rms_norm_match_the_cpu_within_a_few_ulp() {
    let Some(dev) = gpu() else { return };
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    let gate_up = tensor((7, 2 * 200), 7, 12.0);
    let diff = max_rel_diff(&host(&swiglu(&g(&gate_up)).unwrap()), &host(&swiglu(&gate_up).unwrap()));
    assert!(diff < 1e-5, "swiglu {diff}");

    let (x, r) = (tensor((5, 2880), 8, 3.0), tensor((5, 2880), 9, 3.0));
    let w = tensor((1, 2880), 10, 1.0).squeeze(0).unwrap();
    let diff = max_rel_diff(
        &host(&rms_norm(&g(&x), &g(&w), 1e-5).unwrap()),
        &host(&rms_norm(&x, &w, 1e-5).unwrap()),
    );
    assert!(diff < 1e-5, "rms_norm {diff}");
    let (sum, normed) = add_rms_norm(&g(&x), &g(&r), &g(&w), 1e-5).unwrap();
    let (want_sum, want_normed) = add_rms_norm(&x, &r, &w, 1e-5).unwrap();
    assert_eq!(bits(&sum), bits(&want_sum));
    assert!(max_rel_diff(&host(&normed), &host(&want_normed)) < 1e-5);
    // bf16 rows and weight: within bf16's rounding of the f32 reference on the same values.
    let b = |t: &Tensor| g(&t.to_dtype(DType::BF16).unwrap());
    let (_, normed) = add_rms_norm(&b(&x), &b(&r), &b(&w), 1e-5).unwrap();
    let f = |t: &Tensor| t.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap();
    let (_, want) = add_rms_norm(&f(&x), &f(&r), &f(&w), 1e-5).unwrap();
    assert!(max_rel_diff(&host(&normed), &host(&want)) < 2e-2);
}

/// RMSNorm reads a row by vectors of 8 where it can and element by element where it cannot
/// (a width no multiple of 8, rows off a 16-byte boundary), to the same bits; a row wider than
/// one round of a thread's loads (8192) too; and a row's bits do not depend on the others. Two
/// norms side by side in one launch (`rms_norm_pair`) give each its own bits.
#[test]
fn rms_norm_rows_have_the_same_bits_however_they_are_read() {
    let Some(dev) = gpu() else { return };
    for (width, dtype) in [
        (2880, DType::BF16),
        (2883, DType::BF16),
        (8200, DType::F32),
        (61, DType::F32),
    ] {
        let rows = 5;
        let on_gpu = |t: Tensor| t.to_dtype(dtype).unwrap().to_device(&dev).unwrap();
        let (x, r) = (
            on_gpu(tensor((rows, width), 8, 3.0)),
            on_gpu(tensor((rows, width), 9, 3.0)),
        );
        let w = on_gpu(tensor((1, width), 10, 1.0).squeeze(0).unwrap());
        let normed = rms_norm(&x, &w, 1e-5).unwrap();
        // Against the CPU on the same values, within the rows' rounding.
        let f32_host = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_dtype(DType::F32).unwrap();
        let want = rms_norm(&f32_host(&x), &f32_host(&w), 1e-5).unwrap();
        let tolerance = if dtype == DType::BF16 { 2e-2 } else { 1e-5 };
        let diff = max_rel_diff(&host(&normed), &host(&want));
        assert!(diff < tolerance, "width {width}: off the CPU by {diff}");
        // The same rows three elements into a buffer: no row starts 16-byte aligned.
        let flat = x.flatten_all().unwrap();
        let shifted = Tensor::cat(&[flat.narrow(0, 0, 3).unwrap(), flat], 0)
            .unwrap()
            .narrow(0, 3, rows * width)
            .unwrap()
            .reshape((rows, width))
            .unwrap();
        assert_eq!(
            bits(&rms_norm(&shifted, &w, 1e-5).unwrap()),
            bits(&normed),
            "width {width}: unaligned"
        );
        for row in [0, 3] {
            let alone = rms_norm(&x.narrow(0, row, 1).unwrap(), &w, 1e-5).unwrap();
            assert_eq!(
                bits(&alone),
                bits(&normed.narrow(0, row, 1).unwrap()),
                "width {width}: row {row} alone"
            );
        }
        // Fused with the residual add: its sums, then the same norm of them.
        let (sum, fused) = add_rms_norm(&x, &r, &w, 1e-5).unwrap();
        assert_eq!(bits(&sum), bits(&(&x + &r).unwrap()), "width {width}: the sums");
        assert_eq!(
            bits(&fused),
            bits(&rms_norm(&sum, &w, 1e-5).unwrap()),
            "width {width}: fused"
        );
        // Two norms side by side in one launch (an EAGLE drafter's first layer): each half
        // the bits of its own norm, the second rows read unaligned.
        let w2 = on_gpu(tensor((1, width), 11, 1.0).squeeze(0).unwrap());
        let pair = rms_norm_pair(&x, &w, &shifted, &w2, 1e-5).unwrap();
        let apart = Tensor::cat(&[&normed, &rms_norm(&x, &w2, 1e-5).unwrap()], 1).unwrap();
        assert_eq!(bits(&pair), bits(&apart), "width {width}: a pair of norms");
    }
}

/// A batch's metadata and queries, and a paged cache of random keys and values.
struct Batch {
    meta: AttentionMetadata,
    q: Tensor,
    k: Tensor,
    v: Tensor,
}

const BLOCK: usize = 16;

/// Sequences of `(context length, query rows)` on interleaved blocks; rows of every sequence's
/// context already written.
fn batch(seqs: &[(usize, usize)], params: AttentionParams, seed: u64) -> Batch {
    let blocks_each = seqs.iter().map(|(len, _)| len.div_ceil(BLOCK)).max().unwrap();
    let num_blocks = blocks_each * seqs.len();
    let mut meta = AttentionMetadata {
        block_size: BLOCK,
        query_start: vec![0],
        ..Default::default()
    };
    for (s, &(len, rows)) in seqs.iter().enumerate() {
        let table: Vec<u32> = (0..len.div_ceil(BLOCK)).map(|b| (b * seqs.len() + s) as u32).collect();
        for pos in len - rows..len {
            meta.slot_mapping
                .push(table[pos / BLOCK] * BLOCK as u32 + (pos % BLOCK) as u32);
        }
        meta.query_start.push(meta.query_start.last().unwrap() + rows);
        meta.context_lens.push(len);
        meta.block_tables.push(table);
    }
    let kv_width = params.num_kv_heads * params.head_dim;
    Batch {
        q: tensor((meta.num_rows(), params.num_heads * params.head_dim), seed, 1.0),
        k: tensor((num_blocks * BLOCK, kv_width), seed + 1, 1.0),
        v: tensor((num_blocks * BLOCK, kv_width), seed + 2, 1.0),
        meta,
    }
}

#[test]
fn paged_attention_matches_the_cpu_kernel_and_is_batch_invariant() {
    let Some(dev) = gpu() else { return };
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    // gpt-oss's heads (64 query, 8 KV, head_dim 64), a Llama-like layout, the largest head, and
    // one whose keys are read an element a load (head_dim not a multiple of 8).
    for (heads, kv_heads, d) in [(64, 8, 64), (8, 2, 128), (4, 4, 256), (2, 1, 12)] {
        for window in [None, Some(128), Some(5)] {
            for with_sinks in [false, true] {
                let params = AttentionParams {
                    num_heads: heads,
                    num_kv_heads: kv_heads,
                    head_dim: d,
                    scale: 1.0 / (d as f32).sqrt(),
                    sliding_window: window,
                    kv_scale: KvScale::ONE,
                };
                let sink_values = with_sinks.then(|| values(heads, 99, 3.0));
                let sinks = sink_values.clone().map(|v| Sinks::new(v, &Device::Cpu).unwrap());
                let gpu_sinks = sink_values.map(|v| Sinks::new(v, &dev).unwrap());
                let (sinks, gpu_sinks) = (sinks.as_ref(), gpu_sinks.as_ref());
                // A prefill chunk over context, a decode row, an 8-row verification window and a
                // long context of several key tiles.
                let b = batch(&[(40, 17), (9, 1), (300, 8), (700, 1)], params, 11);
                let gpu_meta = b.meta.clone().on_device(&dev).unwrap();
                let what = format!("heads {heads}/{kv_heads}x{d}, window {window:?}, sinks {with_sinks}");
                let want = paged_attention(&b.q, &b.k, &b.v, &b.meta, &params, sinks).unwrap();
                let got = paged_attention(&g(&b.q), &g(&b.k), &g(&b.v), &gpu_meta, &params, gpu_sinks).unwrap();
                let diff = max_rel_diff(&host(&got), &host(&want));
                assert!(diff < 1e-5, "{what}: f32 cache off by {diff}");
                // Queries read in place as a column range of a wider tensor: the same bits.
                let rows = b.meta.num_rows();
                let wide = Tensor::cat(&[&tensor((rows, 8), 15, 1.0), &b.q], 1).unwrap();
                let in_place = paged_attention(
                    &g(&wide).narrow(1, 8, heads * d).unwrap(),
                    &g(&b.k),
                    &g(&b.v),
                    &gpu_meta,
                    &params,
                    gpu_sinks,
                )
                .unwrap();
                assert_eq!(bits(&in_place), bits(&got), "{what}: queries read in place");

                // bf16 queries and cache, against the CPU on the same rounded values.
                let r = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
                let got_bf16 =
                    paged_attention(&g(&r(&b.q)), &g(&r(&b.k)), &g(&r(&b.v)), &gpu_meta, &params, gpu_sinks).unwrap();
                let f = |t: &Tensor| r(t).to_dtype(DType::F32).unwrap();
                let want = paged_attention(&f(&b.q), &r(&b.k), &r(&b.v), &b.meta, &params, sinks).unwrap();
                let diff = max_rel_diff(&host(&got_bf16), &host(&want));
                assert!(diff < 1e-2, "{what}: bf16 off by {diff}");

                // An FP8 cache with per-tensor scales, made on the host: the same bytes on both.
                let fp8 = AttentionParams {
                    kv_scale: KvScale { k: 0.5, v: 0.125 },
                    ..params
                };
                let e4m3 = |t: &Tensor, scale: f32| (t / scale as f64).unwrap().to_dtype(DType::F8E4M3).unwrap();
                let (k8, v8) = (e4m3(&b.k, 0.5), e4m3(&b.v, 0.125));
                let want = paged_attention(&b.q, &k8, &v8, &b.meta, &fp8, sinks).unwrap();
                let got_fp8 = paged_attention(&g(&b.q), &g(&k8), &g(&v8), &gpu_meta, &fp8, gpu_sinks).unwrap();
                let diff = max_rel_diff(&host(&got_fp8), &host(&want));
                assert!(diff < 1e-5, "{what}: fp8 cache off by {diff}");

                // The 8-row window's last row alone gives the same bits as within the batch.
                let alone = AttentionMetadata {
                    block_size: BLOCK,
                    query_start: vec![0, 1],
                    context_lens: vec![300],
                    block_tables: vec![b.meta.block_tables[2].clone()],
                    slot_mapping: vec![b.meta.slot_mapping[17 + 1 + 7]],
                    device: None,
                }
                .on_device(&dev)
                .unwrap();
                let q_row = b.q.narrow(0, 17 + 1 + 7, 1).unwrap();
                let single = paged_attention(&g(&q_row), &g(&b.k), &g(&b.v), &alone, &params, gpu_sinks).unwrap();
                assert_eq!(
                    bits(&single),
                    bits(&got.narrow(0, 17 + 1 + 7, 1).unwrap()),
                    "{what}: alone"
                );
                // A device copy of another size of batch is refused.
                let stale = AttentionMetadata {
                    device: alone.device.clone(),
                    ..b.meta.clone()
                };
                let err = paged_attention(&g(&b.q), &g(&b.k), &g(&b.v), &stale, &params, gpu_sinks).unwrap_err();
                assert!(
                    err.to_string().contains("the metadata's device copy holds"),
                    "{what}: {err}"
                );
            }
        }
    }
}

/// Keys and values into a cache's two halves, each row by its own slot and each half by its
/// own scale, with the CPU's bits: from f32 rows, from bf16 rows, and from column ranges of a
/// fused projection read in place.
#[test]
fn kv_write_rounds_exactly_as_the_cpu() {
    let Some(dev) = gpu() else { return };
    // A padding row's slot writes nothing, on both.
    let slots = AttentionMetadata {
        slot_mapping: vec![5, PAD_SLOT, 17, 3],
        ..Default::default()
    };
    let gpu_slots = slots.clone().on_device(&dev).unwrap();
    // Up to ±4000 / 8 = ±500: FP8 saturates some, as on the CPU.
    let (k, v) = (tensor((4, 96), 12, 4000.0), tensor((4, 96), 15, 300.0));
    let on_gpu = |t: &Tensor| t.to_device(&dev).unwrap();
    for (dtype, scale) in [
        (DType::F32, KvScale::ONE),
        (DType::BF16, KvScale::ONE),
        (DType::F8E4M3, KvScale { k: 8.0, v: 0.5 }),
        (DType::F8E4M3, KvScale::ONE),
    ] {
        let what = format!("{dtype:?} cache, scales {scale:?}");
        let zeros = |dev: &Device| Tensor::zeros((2, 20, 96), dtype, dev).unwrap();
        let cpu = zeros(&Device::Cpu);
        write_kv(&cpu, &k, &v, &slots, scale).unwrap();
        let gpu_cache = zeros(&dev);
        write_kv(&gpu_cache, &on_gpu(&k), &on_gpu(&v), &gpu_slots, scale).unwrap();
        assert_eq!(bits(&gpu_cache), bits(&cpu), "{what}");
        // bf16 rows into the cache.
        let bf16 = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
        let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        let gpu_cache = zeros(&dev);
        write_kv(&gpu_cache, &on_gpu(&bf16(&k)), &on_gpu(&bf16(&v)), &gpu_slots, scale).unwrap();
        let cpu = zeros(&Device::Cpu);
        write_kv(&cpu, &f32(&bf16(&k)), &f32(&bf16(&v)), &slots, scale).unwrap();
        assert_eq!(bits(&gpu_cache), bits(&cpu), "bf16 rows into a {what}");
        // Keys and values read in place from column ranges of one wider tensor (a fused
        // projection's), on both.
        let wide = Tensor::cat(&[&tensor((4, 40), 13, 1.0), &k, &v, &tensor((4, 8), 14, 1.0)], 1).unwrap();
        let columns = |wide: &Tensor| (wide.narrow(1, 40, 96).unwrap(), wide.narrow(1, 136, 96).unwrap());
        let gpu_cache = zeros(&dev);
        let (gk, gv) = columns(&on_gpu(&wide));
        write_kv(&gpu_cache, &gk, &gv, &gpu_slots, scale).unwrap();
        let cpu = zeros(&Device::Cpu);
        let (ck, cv) = columns(&wide);
        write_kv(&cpu, &ck, &cv, &slots, scale).unwrap();
        let want = zeros(&Device::Cpu);
        write_kv(&want, &k, &v, &slots, scale).unwrap();
        assert_eq!(bits(&cpu), bits(&want), "strided rows on the CPU, {what}");
        assert_eq!(bits(&gpu_cache), bits(&want), "strided rows, {what}");
    }
    let cache = Tensor::zeros((2, 20, 96), DType::F32, &dev).unwrap();
    let (gk, gv) = (on_gpu(&k), on_gpu(&v));
    let outside = AttentionMetadata {
        slot_mapping: vec![1, 2, 3, 20],
        ..Default::default()
    }
    .on_device(&dev)
    .unwrap();
    let err = write_kv(&cache, &gk, &gv, &outside, KvScale::ONE).unwrap_err();
    assert!(err.to_string().contains("slot 20 outside"), "{err}");
    // Metadata made for the host has no device copy for the kernel to read.
    let err = write_kv(&cache, &gk, &gv, &slots, KvScale::ONE).unwrap_err();
    assert!(err.to_string().contains("no device copy"), "{err}");
    // A device copy of another batch's slots, fewer than the rows, is refused.
    let stale = AttentionMetadata {
        slot_mapping: vec![5, 6, 7, 8],
        device: AttentionMetadata {
            slot_mapping: vec![5, 6],
            ..Default::default()
        }
        .on_device(&dev)
        .unwrap()
        .device,
        ..Default::default()
    };
    let err = write_kv(&cache, &gk, &gv, &stale, KvScale::ONE).unwrap_err();
    assert!(err.to_string().contains("2 device slots for 4 rows"), "{err}");
}

/// Rotary tables [2, rows, head_dim / 2] for positions 3, 10, 17, ... (angles well past 2π).
fn rotary_tables(rows: usize, head_dim: usize) -> Tensor {
    let half = head_dim / 2;
    let angle = |r: usize, j: usize| (3 + 7 * r) as f32 * 10000f32.powf(-2.0 * j as f32 / head_dim as f32);
    let cos = (0..rows).flat_map(|r| (0..half).map(move |j| angle(r, j).cos()));
    let sin = (0..rows).flat_map(|r| (0..half).map(move |j| angle(r, j).sin()));
    Tensor::from_vec(cos.chain(sin).collect::<Vec<f32>>(), (2, rows, half), &Device::Cpu).unwrap()
}

/// The KV write and attention that rotate what they read give the bits of `rope` first, then
/// the plain kernels: on the GPU, for f32 and bf16 rows read in place from a fused
/// projection's columns, into f32, bf16 and FP8 caches; and the CPU's where the rows are f32.
/// Misshapen tables are refused.
#[test]
fn rotating_kv_write_and_attention_equal_rope_first() {
    let Some(dev) = gpu() else { return };
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    let params = AttentionParams {
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 64,
        scale: 0.125,
        sliding_window: None,
        kv_scale: KvScale::ONE,
    };
    let (q_width, kv_width) = (8 * 64, 2 * 64);
    let b = batch(&[(40, 17), (9, 1), (300, 8)], params, 21);
    let rows = b.meta.num_rows();
    let gpu_meta = b.meta.clone().on_device(&dev).unwrap();
    let tables = rotary_tables(rows, 64);
    let gpu_tables = g(&tables);
    let rotation = Rotation {
        tables: &tables,
        head_dim: 64,
    };
    let gpu_rotation = Rotation {
        tables: &gpu_tables,
        head_dim: 64,
    };
    // A fused projection's output: queries, keys and values side by side.
    let qkv = tensor((rows, q_width + 2 * kv_width), 22, 2.0);
    let columns = |qkv: &Tensor, at: usize, width: usize| qkv.narrow(1, at, width).unwrap();
    for dtype in [DType::F32, DType::BF16] {
        let qkv_gpu = g(&qkv.to_dtype(dtype).unwrap());
        let (q, k, v) = (
            columns(&qkv_gpu, 0, q_width),
            columns(&qkv_gpu, q_width, kv_width),
            columns(&qkv_gpu, q_width + kv_width, kv_width),
        );
        for (cache_dtype, scale) in [
            (DType::F32, KvScale::ONE),
            (DType::BF16, KvScale::ONE),
            (DType::F8E4M3, KvScale { k: 0.5, v: 0.25 }),
        ] {
            let what = format!("{dtype:?} rows, {cache_dtype:?} cache");
            let fresh = || {
                let both = Tensor::zeros((2, b.k.dim(0).unwrap(), kv_width), cache_dtype, &dev).unwrap();
                both.slice_set(&g(&b.k.to_dtype(cache_dtype).unwrap()).unsqueeze(0).unwrap(), 0, 0)
                    .unwrap();
                both.slice_set(&g(&b.v.to_dtype(cache_dtype).unwrap()).unsqueeze(0).unwrap(), 0, 1)
                    .unwrap();
                both
            };
            let (fused, separate) = (fresh(), fresh());
            write_rotated_kv(&fused, &k, &v, &gpu_meta, scale, gpu_rotation).unwrap();
            write_kv(&separate, &gpu_rotation.apply(&k).unwrap(), &v, &gpu_meta, scale).unwrap();
            assert_eq!(bits(&fused), bits(&separate), "{what}: the cache");
            let p = AttentionParams {
                kv_scale: scale,
                ..params
            };
            let half = |t: &Tensor, i| t.get(i).unwrap();
            let got = rotated_paged_attention(
                &q,
                &half(&fused, 0),
                &half(&fused, 1),
                &gpu_meta,
                &p,
                None,
                gpu_rotation,
            )
            .unwrap();
            let rotated_q = gpu_rotation.apply(&q).unwrap();
            let want = paged_attention(
                &rotated_q,
                &half(&separate, 0),
                &half(&separate, 1),
                &gpu_meta,
                &p,
                None,
            )
            .unwrap();
            assert_eq!(bits(&got), bits(&want), "{what}: attention");
            if dtype == DType::F32 {
                let cpu = Tensor::zeros((2, b.k.dim(0).unwrap(), kv_width), cache_dtype, &Device::Cpu).unwrap();
                cpu.slice_set(&b.k.to_dtype(cache_dtype).unwrap().unsqueeze(0).unwrap(), 0, 0)
                    .unwrap();
                cpu.slice_set(&b.v.to_dtype(cache_dtype).unwrap().unsqueeze(0).unwrap(), 0, 1)
                    .unwrap();
                let (cq, ck, cv) = (
                    columns(&qkv, 0, q_width),
                    columns(&qkv, q_width, kv_width),
                    columns(&qkv, q_width + kv_width, kv_width),
                );
                write_rotated_kv(&cpu, &ck, &cv, &b.meta, scale, rotation).unwrap();
                assert_eq!(bits(&fused), bits(&cpu), "{what}: the cache against the CPU's");
                let on_cpu =
                    rotated_paged_attention(&cq, &half(&cpu, 0), &half(&cpu, 1), &b.meta, &p, None, rotation).unwrap();
                let diff = max_rel_diff(&host(&got), &host(&on_cpu));
                assert!(diff < 1e-5, "{what}: attention against the CPU's, off by {diff}");
            }
        }
    }
    // Tables of another batch's rows are refused.
    let short = g(&rotary_tables(rows - 1, 64));
    let wrong = Rotation {
        tables: &short,
        head_dim: 64,
    };
    let q = g(&tensor((rows, q_width), 23, 1.0));
    let both = Tensor::zeros((2, b.k.dim(0).unwrap(), kv_width), DType::F32, &dev).unwrap();
    let kv = g(&tensor((rows, kv_width), 24, 1.0));
    let err = write_rotated_kv(&both, &kv, &kv, &gpu_meta, KvScale::ONE, wrong).unwrap_err();
    assert!(err.to_string().contains("rotary tables"), "{err}");
    let err = rotated_paged_attention(
        &q,
        &both.get(0).unwrap(),
        &both.get(1).unwrap(),
        &gpu_meta,
        &params,
        None,
        wrong,
    )
    .unwrap_err();
    assert!(err.to_string().contains("rotary tables"), "{err}");
}

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

/// An expert's weights dequantized, [2I, H] and [H, I] row-major, and its biases.
struct DenseExpert {
    gate_up: Vec<f32>,
    gate_up_bias: Vec<f32>,
    down: Vec<f32>,
    down_bias: Vec<f32>,
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
fn dense_experts(weights: &[ExpertWeights]) -> Vec<DenseExpert> {
    let dense = |w: &Mxfp4Weight| host(&w.dequantize(&Device::Cpu).unwrap());
    weights
        .iter()
        .map(|(gate_up, gate_up_bias, down, down_bias)| DenseExpert {
            gate_up: dense(gate_up),
            gate_up_bias: gate_up_bias.clone(),
            down: dense(down),
            down_bias: down_bias.clone(),
        })
        .collect()
}

/// The mixture-of-experts block in f64 over the dequantized weights: each row's `top_k` best
/// experts (ties to the lower index), weighted by a softmax over them (or their shares of one
/// over all), each a SwiGLU MLP with biases. With `bf16_activations`, the activations are
/// rounded to f32, then bf16, before the down projection, as the tensor-core kernels read them.
fn moe_reference(
    x: &[f32],
    logits: &[f32],
    experts: &[DenseExpert],
    hidden: usize,
    routing: &Routing,
    bf16_activations: bool,
) -> Vec<f32> {
    let (num_experts, inter) = (experts.len(), experts[0].gate_up_bias.len() / 2);
    let dot = |w: &[f32], x: &[f64]| w.iter().zip(x).map(|(a, b)| *a as f64 * b).sum::<f64>();
    x.chunks_exact(hidden)
        .zip(logits.chunks_exact(num_experts))
        .flat_map(|(x, scores)| {
            let x: Vec<f64> = x.iter().map(|v| *v as f64).collect();
            let mut order: Vec<usize> = (0..num_experts).collect();
            order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
            let max = scores[order[0]] as f64;
            let exps: Vec<f64> = order.iter().map(|e| (scores[*e] as f64 - max).exp()).collect();
            let sum: f64 = if routing.normalize {
                exps[..routing.top_k].iter().sum()
            } else {
                exps.iter().sum()
            };
            let mut out = vec![0f64; hidden];
            for (rank, e) in order.iter().take(routing.top_k).enumerate() {
                let DenseExpert {
                    gate_up,
                    gate_up_bias,
                    down,
                    down_bias,
                } = &experts[*e];
                let act: Vec<f64> = (0..inter)
                    .map(|c| {
                        let g = dot(&gate_up[c * hidden..][..hidden], &x) + gate_up_bias[c] as f64;
                        let u = dot(&gate_up[(inter + c) * hidden..][..hidden], &x) + gate_up_bias[inter + c] as f64;
                        match routing.clamp {
                            Some((alpha, limit)) => {
                                let (g, u) = (g.min(limit as f64), u.clamp(-limit as f64, limit as f64));
                                (u + 1.0) * g / (1.0 + (-g * alpha as f64).exp())
                            }
                            None => g / (1.0 + (-g).exp()) * u,
                        }
                    })
                    .map(|a| match bf16_activations {
                        true => half::bf16::from_f32(a as f32).to_f64(),
                        false => a,
                    })
                    .collect();
                for (h, o) in out.iter_mut().enumerate() {
                    *o += exps[rank] / sum * (dot(&down[h * inter..][..inter], &act) + down_bias[h] as f64);
                }
            }
            out.into_iter().map(|v| v as f32)
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
        let want = moe_reference(&host(&x), &host(&logits), &reference_weights, hidden, &routing, false);
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
        // activation a few ulps from its f64 value may still round the other way (one bf16 ulp
        // of one term). Each batch invariant.
        let b = |t: &Tensor| t.to_dtype(DType::BF16).unwrap().to_device(&dev).unwrap();
        let (xb, logits_b) = (b(&x), b(&logits));
        for (kernel, bf16_activations, tolerance) in [(CudaMatmul::Fma, false, 1e-2), (CudaMatmul::Mma, true, 2e-2)] {
            let want = moe_reference(
                &host(&xb),
                &host(&logits_b),
                &reference_weights,
                hidden,
                &routing,
                bf16_activations,
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

/// Random router logits but for rows that only an order as total as the CPU's sort ranks
/// alike: row 1 of signed zeros (+0 ranks above -0), row 2 of one value throughout (ties go
/// to the lower index).
fn router_logits(rows: usize, experts: usize) -> Tensor {
    let mut v = values(rows * experts, 8, 3.0);
    for (e, z) in v[experts..2 * experts].iter_mut().enumerate() {
        *z = if e % 3 == 0 { -0.0 } else { 0.0 };
    }
    v[2 * experts..3 * experts].fill(1.5);
    Tensor::from_vec(v, (rows, experts), &Device::Cpu).unwrap()
}

/// The tensor cores take tiles of 8 pairs of an expert, or of 32 (`moe_*_mma_wide`), by
/// default where a batch gives the average expert more than 8; a row gives the same bits
/// either way. Forty rows that all favour experts 0 and 1 fill a wide tile of each and part of
/// another: in narrow tiles, in wide ones and as the batch chooses (wide), they agree bit for
/// bit, within bf16 of the reference, and with each row alone (narrow) and the first 16
/// together (64 pairs: narrow).
#[test]
fn mxfp4_experts_give_the_same_bits_in_wide_tiles_as_in_narrow_ones() {
    let Some(dev) = gpu() else { return };
    let routing = Routing {
        top_k: 4,
        normalize: true,
        clamp: Some((1.702, 7.0)),
    };
    let (num_experts, hidden, inter, rows) = (8, 128, 96, 40);
    let weights = random_experts(num_experts, hidden, inter);
    let on_gpu = Mxfp4Experts::new(&dev, &borrowed(&weights)).unwrap();
    let mut scores = values(rows * num_experts, 8, 1.0);
    for row in scores.chunks_exact_mut(num_experts) {
        row[0] += 4.0;
        row[1] += 3.0;
    }
    let logits = Tensor::from_vec(scores, (rows, num_experts), &Device::Cpu).unwrap();
    let x = tensor((rows, hidden), 7, 1.0);
    let b = |t: &Tensor| t.to_dtype(DType::BF16).unwrap().to_device(&dev).unwrap();
    let (xb, logits_b) = (b(&x), b(&logits));
    let forward = |first: usize, n: usize, tiles: MmaTiles| {
        let part = |t: &Tensor| t.narrow(0, first, n).unwrap();
        on_gpu
            .forward_tiled(&part(&xb), &part(&logits_b), &routing, CudaMatmul::Mma, tiles)
            .unwrap()
    };
    let wide = forward(0, rows, MmaTiles::Wide);
    let want = moe_reference(
        &host(&xb),
        &host(&logits_b),
        &dense_experts(&weights),
        hidden,
        &routing,
        true,
    );
    let diff = max_rel_diff(&host(&wide), &want);
    assert!(diff < 2e-2, "wide tiles off the reference by {diff}");
    for tiles in [MmaTiles::Narrow, MmaTiles::ByBatch] {
        assert_eq!(bits(&forward(0, rows, tiles)), bits(&wide), "{tiles:?}");
    }
    let first = forward(0, 16, MmaTiles::ByBatch);
    assert_eq!(bits(&first), bits(&wide.narrow(0, 0, 16).unwrap()), "the first 16 rows");
    for r in 0..rows {
        let alone = forward(r, 1, MmaTiles::ByBatch);
        assert_eq!(bits(&alone), bits(&wide.narrow(0, r, 1).unwrap()), "row {r} alone");
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

//! The batch-invariant matmuls: the CUDA cores' against the CPU bit for bit, the tensor cores'
//! in both forms, and block-scaled FP8 weights.
use super::{bits, gpu, host, max_rel_diff, tensor};
use candle_core::{DType, Tensor};
use peagle_kernels::{
    fp8_linear, fp8_linear_tiled, invariant_linear, invariant_linear_swiglu, invariant_matmul, invariant_matmul_by,
    invariant_matmul_tiled, swiglu, CudaMatmul, Fp8Weight, MmaTiles,
};

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
/// size, from 1 (its narrow form) to 2048 (its wide one: 72 columns are too few blocks for the
/// staged one), wherever the row sits and in any form asked for, with K of 33 steps and of 3
/// (fewer than the chain's 8 residues); its values are the product's within bf16 rounding. Products it does not take
/// (K not a multiple of 32, f32 activations) are the CUDA-core kernel's, bit for bit.
#[test]
fn tensor_core_matmul_is_batch_invariant_and_within_bf16_of_the_product() {
    let Some(dev) = gpu() else { return };
    let bf16 = |t: Tensor| t.to_dtype(DType::BF16).unwrap();
    let mma = |x: &Tensor, w: &Tensor| invariant_matmul_by(x, w, CudaMatmul::Mma).unwrap();
    // N not a multiple of a block's columns, nor M of its rows.
    for (n, k) in [(72, 1056), (40, 96)] {
        let w = bf16(tensor((n, k), 1, 0.1)).to_device(&dev).unwrap();
        let x = bf16(tensor((2048, k), 2, 1.0)).to_device(&dev).unwrap();
        let all = bits(&mma(&x, &w));
        for m in [1, 3, 8, 9, 13, 64, 127, 128, 256] {
            let got = bits(&mma(&x.narrow(0, 0, m).unwrap(), &w));
            assert_eq!(got, all[..m * n], "K = {k}: the first {m} rows");
        }
        let alone = bits(&mma(&x.narrow(0, 777, 1).unwrap(), &w));
        assert_eq!(alone, all[777 * n..778 * n], "K = {k}: row 777 alone");
        // Any form at any batch size, against the form its size picks.
        for (m, tiles) in [
            (300, MmaTiles::Narrow),
            (300, MmaTiles::Wide),
            (5, MmaTiles::Wide),
            (5, MmaTiles::Staged),
            (70, MmaTiles::Staged),
            (2048, MmaTiles::Staged),
        ] {
            let got = bits(&invariant_matmul_tiled(&x.narrow(0, 0, m).unwrap(), &w, CudaMatmul::Mma, tiles).unwrap());
            assert_eq!(got, all[..m * n], "K = {k}: {m} rows in {tiles:?} tiles");
        }
    }
    let (n, k) = (72, 1056);
    let w = bf16(tensor((n, k), 1, 0.1));
    let x = bf16(tensor((2048, k), 2, 1.0));
    let (wg, xg) = (w.to_device(&dev).unwrap(), x.to_device(&dev).unwrap());
    // With a bias, added to each f32 sum before its rounding.
    let bias = bf16(tensor((1, n), 6, 1.0).flatten_all().unwrap());
    let biased = |x: &Tensor| {
        bits(&invariant_linear(x, &wg, Some(&bias.to_device(&dev).unwrap()), Some(CudaMatmul::Mma)).unwrap())
    };
    let all_biased = biased(&xg);
    for m in [1, 9, 200] {
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

/// bf16 rows times a block-scaled FP8 weight on the tensor cores (`linear_mma_bf16_f8e4m3`,
/// each step's sums scaled): within bf16 of the CPU's product at every batch size, over blocks
/// of 128 that K (33 steps of 32) and N do not fill; the same bits narrow, wide and as the
/// batch chooses; and a row's bits alone are its bits in the batch.
#[test]
fn fp8_weights_on_the_tensor_cores_are_batch_invariant_and_near_the_cpu() {
    let Some(dev) = gpu() else { return };
    let (n, k, block) = (200, 33 * 32, (128, 128));
    let weight = tensor((n, k), 30, 300.0).to_dtype(DType::F8E4M3).unwrap();
    let scales = tensor((2, 9), 31, 1.0).abs().unwrap().affine(1e-3, 1e-4).unwrap();
    let cpu_weight = Fp8Weight::new(weight.clone(), scales.clone(), block).unwrap();
    let gpu_weight = Fp8Weight::new(weight.to_device(&dev).unwrap(), scales.to_device(&dev).unwrap(), block).unwrap();
    for m in [1, 8, 9, 64] {
        let xb = tensor((m, k), 32 + m as u64, 1.0).to_dtype(DType::BF16).unwrap();
        let on_gpu = xb.to_device(&dev).unwrap();
        let by = |x: &Tensor, tiles| fp8_linear_tiled(x, &gpu_weight, CudaMatmul::Mma, tiles).unwrap();
        let got = by(&on_gpu, MmaTiles::ByBatch);
        let want = fp8_linear(&xb.to_dtype(DType::F32).unwrap(), &cpu_weight).unwrap();
        let diff = max_rel_diff(&host(&got), &host(&want));
        assert!(diff < 1e-2, "M = {m}: {diff} off the CPU");
        for tiles in [MmaTiles::Narrow, MmaTiles::Wide, MmaTiles::Staged] {
            assert_eq!(bits(&by(&on_gpu, tiles)), bits(&got), "M = {m}, {tiles:?}");
        }
        let last = by(&on_gpu.narrow(0, m - 1, 1).unwrap(), MmaTiles::ByBatch);
        assert_eq!(
            bits(&last),
            bits(&got.narrow(0, m - 1, 1).unwrap()),
            "M = {m}: its last row alone"
        );
    }
}

/// A fused gate/up projection's SwiGLU (`invariant_linear_swiglu`) has the bits of the
/// projection followed by `swiglu`: on the tensor cores in one launch, narrow, wide, staged or
/// as the batch chooses, at every batch size, with a bias and without, for gate widths that fill no
/// whole tile (40) and one that does (64); where the tensor cores do not take the product (K
/// no multiple of 32, f32 rows), by the two ops. An odd number of features is refused.
#[test]
fn linear_swiglu_has_the_bits_of_the_projection_then_swiglu() {
    let Some(dev) = gpu() else { return };
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    let bf16 = |t: &Tensor| g(&t.to_dtype(DType::BF16).unwrap());
    for (inter, k) in [(40, 96), (64, 64), (24, 40)] {
        let w = tensor((2 * inter, k), 21, 0.3);
        let bias = tensor((1, 2 * inter), 22, 1.0).flatten_all().unwrap();
        for m in [1, 5, 8, 9, 40, 130] {
            let x = tensor((m, k), 23 + m as u64, 1.0);
            for bias in [None, Some(&bias)] {
                let (xb, wb, bb) = (bf16(&x), bf16(&w), bias.map(bf16));
                let want = swiglu(&invariant_linear(&xb, &wb, bb.as_ref(), None).unwrap()).unwrap();
                for tiles in [MmaTiles::ByBatch, MmaTiles::Narrow, MmaTiles::Wide, MmaTiles::Staged] {
                    let got = invariant_linear_swiglu(&xb, &wb, bb.as_ref(), tiles).unwrap();
                    assert_eq!(got.dims(), [m, inter]);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "bf16, I = {inter}, K = {k}, M = {m}, {tiles:?}, bias: {}",
                        bias.is_some()
                    );
                }
                let bg = bias.map(g);
                let want = swiglu(&invariant_linear(&g(&x), &g(&w), bg.as_ref(), None).unwrap()).unwrap();
                let got = invariant_linear_swiglu(&g(&x), &g(&w), bg.as_ref(), MmaTiles::ByBatch).unwrap();
                assert_eq!(bits(&got), bits(&want), "f32, I = {inter}, K = {k}, M = {m}");
            }
        }
    }
    let x = bf16(&tensor((2, 64), 3, 1.0));
    let err = invariant_linear_swiglu(&x, &bf16(&tensor((9, 64), 4, 1.0)), None, MmaTiles::ByBatch).unwrap_err();
    assert!(err.to_string().contains("do not split into gate and up"), "{err}");
}

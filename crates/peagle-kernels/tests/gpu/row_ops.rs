//! Row-wise kernels: RoPE, SwiGLU, RMSNorm (alone, fused with the residual add, and two side
//! by side), the gather of rows from two tables, the chaining of drafter passes and the ids
//! taken where they lie.
use super::{bits, gpu, host, max_rel_diff, tensor};
use candle_core::{DType, Device, Tensor};
use peagle_kernels::{
    add_rms_norm, chain_drafts, gather_rows, gather_rows_into, pick_ids, rms_norm, rms_norm_pair, rope, swiglu,
    take_ids, upload_into, Indices, LastPass,
};

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

/// Rows gathered on the GPU from two tables are the CPU's, bit for bit: in f32 and bf16, at
/// gpt-oss's width and at one that is no multiple of the block's threads, picks from both
/// tables in any order and repeated, uploaded by the launch or already on the device, from a
/// strided first table, and from one table alone.
#[test]
fn gather_rows_equals_the_cpu_bitwise() {
    let Some(dev) = gpu() else { return };
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    let picks = [9, 0, 10, 8, 9, 3, 3];
    let on_host = Indices::new(&picks);
    let on_device = uploaded(&picks, &dev);
    for cols in [2880, 300] {
        let wide = tensor((9, 2 * cols), 11, 4.0);
        let first = wide.narrow(1, cols, cols).unwrap();
        let second = tensor((2, cols), 12, 4.0);
        for dtype in [DType::F32, DType::BF16] {
            let (first, second) = (first.to_dtype(dtype).unwrap(), second.to_dtype(dtype).unwrap());
            let want = gather_rows(&first, Some(&second), &on_host).unwrap();
            for (picks, what) in [(&on_host, "uploaded by the launch"), (&on_device, "on the device")] {
                let got = gather_rows(&g(&first), Some(&g(&second)), picks).unwrap();
                assert_eq!(got.dtype(), dtype);
                assert_eq!(bits(&got), bits(&want), "{dtype:?}, {cols} columns, picks {what}");
            }
            let want = gather_rows(&first, None, &Indices::new(&[8, 1])).unwrap();
            let got = gather_rows(&g(&first), None, &Indices::new(&[8, 1])).unwrap();
            assert_eq!(bits(&got), bits(&want), "{dtype:?}, {cols} columns, one table");

            // Into rows of a tensor that exists, leaving the others as they were.
            let out = g(&Tensor::ones((5, cols), dtype, &Device::Cpu).unwrap());
            let middle = out.narrow(0, 1, picks.len() - 4).unwrap();
            gather_rows_into(&middle, &g(&first), Some(&g(&second)), &on_device.first(3).unwrap()).unwrap();
            let want = Tensor::cat(
                &[
                    &Tensor::ones((1, cols), dtype, &Device::Cpu).unwrap(),
                    &gather_rows(&first, Some(&second), &on_host.first(3).unwrap()).unwrap(),
                    &Tensor::ones((1, cols), dtype, &Device::Cpu).unwrap(),
                ],
                0,
            )
            .unwrap();
            assert_eq!(bits(&out), bits(&want), "{dtype:?}, {cols} columns, into a tensor");

            // A device copy past the tables, which the host's cannot show, writes nothing.
            let out = g(&Tensor::ones((2, cols), dtype, &Device::Cpu).unwrap());
            let wrong = Indices::uploaded(&[0, 1], g(&Tensor::new(&[11u32, 1], &Device::Cpu).unwrap())).unwrap();
            gather_rows_into(&out, &g(&first), Some(&g(&second)), &wrong).unwrap();
            let want = Tensor::cat(
                &[
                    &Tensor::ones((1, cols), dtype, &Device::Cpu).unwrap(),
                    &first.narrow(0, 1, 1).unwrap(),
                ],
                0,
            )
            .unwrap();
            assert_eq!(
                bits(&out),
                bits(&want),
                "{dtype:?}, {cols} columns, a pick past the tables"
            );
        }
    }
}

/// `values` as indices already on `dev`: a view into the middle of a larger upload, as a
/// forward's inputs hold them.
fn uploaded<'a>(values: &'a [u32], dev: &Device) -> Indices<'a> {
    let all: Vec<u32> = [&[77u32, 78][..], values, &[79]].concat();
    let all = Tensor::new(all.as_slice(), dev).unwrap();
    Indices::uploaded(values, all.narrow(0, 2, values.len()).unwrap()).unwrap()
}

/// Values uploaded into a tensor on the GPU land in its elements and no others, and a tensor of
/// another size or dtype is refused.
#[test]
fn upload_into_writes_its_tensor_on_the_gpu() {
    let Some(dev) = gpu() else { return };
    let all = Tensor::zeros((3, 4), DType::U32, &dev).unwrap();
    upload_into(&all.narrow(0, 1, 1).unwrap(), &[5u32, 6, 7, 8]).unwrap();
    assert_eq!(all.to_vec2::<u32>().unwrap(), [[0; 4], [5, 6, 7, 8], [0; 4]]);
    let floats = Tensor::zeros(3, DType::F32, &dev).unwrap();
    upload_into(&floats, &[0.5f32, -1.0, 2.0]).unwrap();
    assert_eq!(floats.to_vec1::<f32>().unwrap(), [0.5, -1.0, 2.0]);
    assert!(upload_into(&floats, &[1u32, 2, 3]).is_err());
    assert!(upload_into(&floats, &[1f32, 2.0]).is_err());
}

/// The next drafter pass's inputs chained on the GPU equal the CPU's: the hidden rows bit for
/// bit, at a width that is no multiple of the block's threads and at gpt-oss's, and the tokens
/// and drafts (an id past the map included), written into views of larger tensors.
#[test]
fn chain_drafts_equals_the_cpu() {
    let Some(dev) = gpu() else { return };
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    let ids = Tensor::new(&[3u32, 0, 7, 200], &Device::Cpu).unwrap();
    let to_target: Vec<u32> = (0..8).map(|i| 1000 + 3 * i).collect();
    let to_target = Tensor::new(to_target.as_slice(), &Device::Cpu).unwrap();
    let picks = [2, 0, 3, 1, 1, 0];
    for cols in [300, 2880] {
        for dtype in [DType::F32, DType::BF16] {
            let hidden = tensor((4, cols), 13, 4.0).to_dtype(dtype).unwrap();
            let run = |on: &dyn Fn(&Tensor) -> Tensor, into: bool| {
                let inputs = on(&Tensor::zeros(9, DType::U32, &Device::Cpu).unwrap());
                let drafts = on(&Tensor::zeros(5, DType::U32, &Device::Cpu).unwrap());
                let hidden_into = on(&Tensor::ones((picks.len(), cols), dtype, &Device::Cpu).unwrap());
                let last = LastPass {
                    ids: &on(&ids),
                    hidden: &on(&hidden),
                    to_target: &on(&to_target),
                };
                let tokens = inputs.narrow(0, 2, picks.len()).unwrap();
                let rows = drafts.narrow(0, 1, 3).unwrap();
                // On the GPU, the picks come as a forward's inputs hold them.
                let picks = match on(&ids).device().is_cuda() {
                    true => uploaded(&picks, &dev),
                    false => Indices::new(&picks),
                };
                let got = chain_drafts(last, &picks, &tokens, &rows, into.then_some(&hidden_into)).unwrap();
                (bits(&got), host(&inputs), host(&drafts))
            };
            let want = run(&|t: &Tensor| t.clone(), false);
            for into in [false, true] {
                assert_eq!(run(&g, into), want, "{dtype:?}, {cols} columns, into {into}");
            }
        }
    }
}

/// take_ids writes what its CPU reference writes, mapped and not: over more places than one
/// block has threads, into a view of a larger tensor whose other elements stay, with an id
/// past the map, its places and picks uploaded by the launch or already on the device. A
/// device copy of the indices that disagrees with the host's, past the tensors, writes nothing.
#[test]
fn take_ids_equals_the_cpu() {
    let Some(dev) = gpu() else { return };
    let n = 300;
    let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7) % 61).chain([500]).collect();
    let ids = Tensor::new(ids.as_slice(), &Device::Cpu).unwrap();
    let map: Vec<u32> = (0..64).map(|i| 1000 + 3 * i).collect();
    let map = Tensor::new(map.as_slice(), &Device::Cpu).unwrap();
    // Every other place of the view, backwards; the picks run over every id, the last included.
    let at: Vec<u32> = (0..n as u32).rev().map(|i| 2 * i).collect();
    let picks: Vec<u32> = (0..n as u32).map(|i| (i * 13 + 1) % (n as u32 + 1)).collect();
    let on_gpu = |t: &Tensor| t.to_device(&dev).unwrap();
    for mapped in [false, true] {
        let run = |on: &dyn Fn(&Tensor) -> Tensor, at: &Indices, picks: &Indices| {
            let inputs = on(&Tensor::full(7u32, 2 * n + 5, &Device::Cpu).unwrap());
            let out = inputs.narrow(0, 3, 2 * n).unwrap();
            take_ids(&out, at, &on(&ids), picks, mapped.then(|| on(&map)).as_ref()).unwrap();
            inputs.to_vec1::<u32>().unwrap()
        };
        let (at_host, picks_host) = (Indices::new(&at), Indices::new(&picks));
        let want = run(&|t: &Tensor| t.clone(), &at_host, &picks_host);
        assert!(
            want.contains(&7) && (!mapped || want.contains(&0)),
            "untouched places and an unmapped id"
        );
        assert_eq!(run(&on_gpu, &at_host, &picks_host), want, "mapped {mapped}");
        let (at_dev, picks_dev) = (uploaded(&at, &dev), uploaded(&picks, &dev));
        assert_eq!(
            run(&on_gpu, &at_dev, &picks_dev),
            want,
            "mapped {mapped}, indices on the device"
        );

        // pick_ids: element j of a new tensor, or of one given, is the take of pick j.
        let want: Vec<u32> = at.iter().map(|&place| want[3 + place as usize]).collect();
        let map = mapped.then(|| on_gpu(&map));
        let got = pick_ids(&on_gpu(&ids), &picks_dev, map.as_ref(), None).unwrap();
        assert_eq!(got.to_vec1::<u32>().unwrap(), want, "mapped {mapped}, picked");
        let into = on_gpu(&Tensor::full(7u32, n + 2, &Device::Cpu).unwrap());
        pick_ids(
            &on_gpu(&ids),
            &picks_host,
            map.as_ref(),
            Some(&into.narrow(0, 1, n).unwrap()),
        )
        .unwrap();
        let got = into.to_vec1::<u32>().unwrap();
        assert_eq!(
            (got[0], &got[1..=n], got[n + 1]),
            (7, &want[..], 7),
            "mapped {mapped}, picked into"
        );
    }

    let out = on_gpu(&Tensor::full(7u32, 4, &Device::Cpu).unwrap());
    let wrong = |values: &[u32]| on_gpu(&Tensor::new(values, &Device::Cpu).unwrap());
    let at = Indices::uploaded(&[0, 1], wrong(&[4, 1])).unwrap();
    let picks = Indices::uploaded(&[0, 1], wrong(&[0, 301])).unwrap();
    take_ids(&out, &at, &on_gpu(&ids), &picks, None).unwrap();
    assert_eq!(
        out.to_vec1::<u32>().unwrap(),
        [7; 4],
        "a place past out, a pick past ids"
    );
}

//! bf16 and FP8 caches: each attends as an f32 cache of the values it gives back, FP8 within
//! its rounding; caches of mixed dtypes are refused; and what `write_kv` stores: nothing for a
//! padding row, FP8 saturated, under a positive scale only.

use super::*;

/// `s` with its keys and values rounded to bf16 and widened back.
fn rounded(s: &Seq) -> Seq {
    let round = |xs: &[f32]| xs.iter().map(|x| f32::from(bf16::from_f32(*x))).collect();
    Seq {
        params: s.params,
        len: s.len,
        q: s.q.clone(),
        k: round(&s.k),
        v: round(&s.v),
        blocks: s.blocks.clone(),
    }
}

#[test]
fn a_bf16_cache_attends_exactly_as_an_f32_cache_of_the_rounded_values() {
    let a = seq(19, 70, vec![5, 1, 3, 8, 0]);
    let b = seq(7, 80, vec![2, 6]);
    let half = cache_of(DType::BF16, &[&a, &b], 10);
    let (ra, rb) = (rounded(&a), rounded(&b));
    let wide = cache_with(&[&ra, &rb], 10);
    let stored: Vec<Vec<f32>> = half.k.to_dtype(DType::F32).unwrap().to_vec2().unwrap();
    let want: Vec<Vec<f32>> = wide.k.to_vec2().unwrap();
    assert_eq!(stored, want, "write_kv rounds keys to nearest bf16");
    for window in [None, Some(5)] {
        let got = run(&half, &[&a, &b], &[9, 1], window);
        assert_eq!(got, run(&wide, &[&ra, &rb], &[9, 1], window), "window {window:?}");
        // And it is still attention: within bf16's rounding of the exact values.
        let mut row = 0;
        for (s, r) in [(&a, 9), (&b, 1)] {
            for pos in s.len - r..s.len {
                for (g, w) in got[row].iter().zip(reference_row(s, pos, window)) {
                    assert!((g - w).abs() < 2e-2, "row {row}: {g} vs {w}");
                }
                row += 1;
            }
        }
    }
}

/// A zero query for the last of a 3-token sequence in block 0, and its metadata.
fn last_row_of_three() -> (Tensor, AttentionMetadata) {
    let q = Tensor::zeros((1, PARAMS.num_heads * PARAMS.head_dim), DType::F32, &Device::Cpu).unwrap();
    let meta = AttentionMetadata {
        block_size: BLOCK,
        query_start: vec![0, 1],
        context_lens: vec![3],
        block_tables: vec![vec![0]],
        slot_mapping: vec![2],
        device: None,
    };
    (q, meta)
}

#[test]
fn mixed_cache_dtypes_are_an_error() {
    let a = seq(3, 90, vec![0]);
    let (f32s, halves) = (cache_with(&[&a], 1), cache_of(DType::BF16, &[&a], 1));
    let (q, meta) = last_row_of_three();
    let err = paged_attention(&q, &f32s.k, &halves.v, &meta, &PARAMS, None).unwrap_err();
    assert!(err.to_string().contains("both f32, both bf16 or both f8e4m3"), "{err}");
}

/// `s` with its keys and values as an FP8 cache with `scale` gives them back: divided by the
/// scale, rounded to e4m3, times the scale.
fn dequantized(s: &Seq, scale: KvScale) -> Seq {
    let round = |xs: &[f32], scale: f32| {
        xs.iter()
            .map(|x| f32::from(F8E4M3::from_f32(x / scale)) * scale)
            .collect()
    };
    Seq {
        params: AttentionParams {
            kv_scale: KvScale::ONE,
            ..s.params
        },
        len: s.len,
        q: s.q.clone(),
        k: round(&s.k, scale.k),
        v: round(&s.v, scale.v),
        blocks: s.blocks.clone(),
    }
}

fn with_scale(s: &Seq, kv_scale: KvScale) -> Seq {
    Seq {
        params: AttentionParams { kv_scale, ..s.params },
        ..prefix(s, s.len)
    }
}

/// Largest absolute difference between rows and the dense reference of the same positions.
fn error_against_reference(got: &[Vec<f32>], rows: &[(&Seq, usize)], window: Option<usize>) -> f32 {
    rows.iter()
        .zip(got)
        .flat_map(|((s, pos), row)| {
            let want = reference_row(s, *pos, window);
            row.iter().zip(want).map(|(g, w)| (g - w).abs()).collect::<Vec<_>>()
        })
        .fold(0.0, f32::max)
}

/// An FP8 cache stores `x / scale` rounded to e4m3 and attends as an f32 cache of the values
/// it gives back, up to where the scales are applied (into the score scale and the final
/// division, not each element); each row keeps its bits in any batch.
#[test]
fn an_fp8_cache_attends_as_an_f32_cache_of_its_dequantized_values() {
    // Keys up to 64 / 4 = 16 after scaling, values up to 1 / 0.01 = 100: inside e4m3's ±448.
    let scale = KvScale { k: 0.25, v: 0.01 };
    let a = with_scale(&seq(19, 70, vec![5, 1, 3, 8, 0]), scale);
    let b = with_scale(&seq(7, 80, vec![2, 6]), scale);
    let fp8 = cache_of(DType::F8E4M3, &[&a, &b], 10);
    let stored: Vec<u8> = fp8
        .k
        .flatten_all()
        .unwrap()
        .to_vec1::<F8E4M3>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let kw = PARAMS.num_kv_heads * PARAMS.head_dim;
    for pos in [0, 7, 18] {
        let want: Vec<u8> = a.k[pos * kw..][..kw]
            .iter()
            .map(|x| F8E4M3::from_f32(x / scale.k).to_bits())
            .collect();
        assert_eq!(
            stored[slot(&a, pos) as usize * kw..][..kw],
            want,
            "write_kv stores fp8(k / k_scale)"
        );
    }
    let (da, db) = (dequantized(&a, scale), dequantized(&b, scale));
    let wide = cache_with(&[&da, &db], 10);
    for window in [None, Some(5)] {
        let got = run(&fp8, &[&a, &b], &[9, 1], window);
        let want = run(&wide, &[&da, &db], &[9, 1], window);
        for (g, w) in got.iter().zip(&want) {
            assert_close(g, w, "fp8 against f32 of the dequantized values");
        }
        for (r, pos) in (a.len - 9..a.len).enumerate() {
            let alone = run(&fp8, &[&prefix(&a, pos + 1)], &[1], window);
            assert_eq!(alone[0], got[r], "row at {pos} alone");
        }
    }
}

/// The error an FP8 cache adds, against the exact attention and against a bf16 cache: e4m3
/// keeps 4 bits of mantissa to bf16's 8, so its error is larger, but bounded.
#[test]
fn an_fp8_cache_errs_more_than_bf16_but_within_its_rounding() {
    let a = seq(40, 90, (0..10).rev().collect());
    let b = seq(13, 100, vec![10, 12, 11, 13]);
    let rows: Vec<(&Seq, usize)> = (a.len - 9..a.len).map(|p| (&a, p)).chain([(&b, b.len - 1)]).collect();
    let error = |dtype| {
        let cache = cache_of(dtype, &[&a, &b], 14);
        error_against_reference(&run(&cache, &[&a, &b], &[9, 1], None), &rows, None)
    };
    let (bf16_error, fp8_error) = (error(DType::BF16), error(DType::F8E4M3));
    // Values in [-1, 1]: e4m3 rounds each key and value by at most 2^-4 of itself.
    assert!(fp8_error < 3e-2, "fp8: max abs error {fp8_error}");
    assert!(bf16_error < 2e-3, "bf16: max abs error {bf16_error}");
    assert!(fp8_error > 4.0 * bf16_error, "fp8 {fp8_error} vs bf16 {bf16_error}");
}

/// A row whose slot is `PAD_SLOT` writes nothing; any other slot outside the cache is refused.
#[test]
fn padding_rows_write_nothing() {
    let dev = Device::Cpu;
    let cache = Cache::zeros(DType::F32, 4, 2);
    let rows = Tensor::from_slice(&[1f32, 2.0, 3.0, 4.0], (2, 2), &dev).unwrap();
    write_kv(
        &cache.both,
        &rows,
        &(&rows * 2.0).unwrap(),
        &at_slots(&[PAD_SLOT, 2]),
        KvScale::ONE,
    )
    .unwrap();
    let stored: Vec<Vec<f32>> = cache.k.to_vec2().unwrap();
    assert_eq!(stored, [[0.0, 0.0], [0.0, 0.0], [3.0, 4.0], [0.0, 0.0]]);
    let stored: Vec<Vec<f32>> = cache.v.to_vec2().unwrap();
    assert_eq!(stored, [[0.0, 0.0], [0.0, 0.0], [6.0, 8.0], [0.0, 0.0]]);
    let err = write_kv(&cache.both, &rows, &rows, &at_slots(&[PAD_SLOT - 1, 2]), KvScale::ONE).unwrap_err();
    assert!(err.to_string().contains("outside a cache of 4"), "{err}");
}

/// e4m3 has no infinity: keys past ±448 times the scale are stored as ±448, as CUDA's
/// conversion does; a scale that is not a positive number is refused.
#[test]
fn fp8_saturates_and_scales_must_be_positive() {
    let dev = Device::Cpu;
    let cache = Cache::zeros(DType::F8E4M3, 4, 2);
    let rows = Tensor::from_slice(&[1000f32, -1e30, 3.0, f32::INFINITY], (2, 2), &dev).unwrap();
    let scale = KvScale { k: 2.0, v: 4.0 };
    write_kv(&cache.both, &rows, &rows, &at_slots(&[3, 1]), scale).unwrap();
    let stored = |t: &Tensor| -> Vec<Vec<f32>> { t.to_dtype(DType::F32).unwrap().to_vec2().unwrap() };
    assert_eq!(stored(&cache.k)[3], [448.0, -448.0]);
    assert_eq!(stored(&cache.k)[1], [1.5, 448.0]);
    assert_eq!(stored(&cache.v)[1], [0.75, 448.0]);
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let err = write_kv(
            &cache.both,
            &rows,
            &rows,
            &at_slots(&[3, 1]),
            KvScale { k: bad, v: 1.0 },
        )
        .unwrap_err();
        assert!(err.to_string().contains("is not a positive number"), "{err}");
    }
    let a = seq(3, 110, vec![0]);
    let cache = cache_of(DType::F8E4M3, &[&a], 1);
    let (q, meta) = last_row_of_three();
    let zero = AttentionParams {
        kv_scale: KvScale { k: 1.0, v: 0.0 },
        ..PARAMS
    };
    assert!(paged_attention(&q, &cache.k, &cache.v, &meta, &zero, None).is_err());
}

//! Choosing tokens on the device: argmax, a row's candidates for top-k and top-p, Gumbel-max
//! draws and grammar bans, each against the CPU.
use super::{bits, gpu, values};
use crate::common::{chi_square, draws_of_one_row};
use candle_core::{DType, Device, Tensor};
use peagle_kernels::{
    argmax_each_row, argmax_rows, gumbel_sample, mask_tokens, row_candidates, CandidateRequest, GumbelRequest,
    RowCandidates, MAX_ROW_CANDIDATES, TOKEN_MASK_WORD_BITS,
};

/// Each requested row's argmax on the GPU is the CPU's (the first largest, NaN never), at a
/// gpt-oss-sized vocabulary (read eight logits a load) and at one a little smaller that is no
/// multiple of 8 (read one at a time), with ties and NaN planted, in f32 and bf16, for every
/// row (which uploads no list of rows) and for a few in another order. The argmax of every row
/// left on the device (`argmax_each_row`) holds the same ids.
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
        for (x, what) in [(&x, "f32"), (&xb, "bf16")] {
            let on_gpu = argmax_each_row(&x.to_device(&dev).unwrap()).unwrap();
            assert!(on_gpu.device().is_cuda(), "{what}: left on the device");
            let want = argmax_rows(&x.to_dtype(DType::F32).unwrap(), &every).unwrap();
            assert_eq!(
                on_gpu.to_vec1::<u32>().unwrap(),
                want,
                "{what}, every row, vocabulary {vocab}"
            );
        }
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

/// Grammar bans on the GPU are the CPU's, bit for bit: gpt-oss's vocabulary (a whole number
/// of words) and ones whose last word is part full, rows with every bit, none, and random ones.
#[test]
fn mask_tokens_equals_the_cpu() {
    let Some(dev) = gpu() else { return };
    for (rows, vocab) in [(3, 201_088), (3, 201_085), (5, 1000), (3, 33)] {
        let x = sampling_rows(rows, vocab);
        let words = vocab.div_ceil(TOKEN_MASK_WORD_BITS);
        let mut state = 0x9e37_79b9_u32;
        let row_bits: Vec<u32> = (0..rows * words)
            .map(|i| match i / words {
                0 => u32::MAX,
                1 => 0,
                _ => {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    state
                }
            })
            .collect();
        let allowed = Tensor::from_vec(row_bits, (rows, words), &Device::Cpu).unwrap();
        let want = mask_tokens(&x, &allowed).unwrap();
        let got = mask_tokens(&x.to_device(&dev).unwrap(), &allowed.to_device(&dev).unwrap()).unwrap();
        assert_eq!(bits(&got), bits(&want), "{rows} rows of {vocab}");
    }
}

//! Gumbel-max sampling on the CPU: the draws follow the tempered softmax, and a key always
//! draws the same token.

mod common;
use candle_core::{Device, Tensor};
use common::{chi_square, draws_of_one_row};
use peagle_kernels::{gumbel_sample, GumbelRequest};

/// Draws over many keys follow softmax(logits / T): a chi-square test at the 0.1% level.
#[test]
fn draws_follow_the_tempered_softmax() {
    let row = [1.0f32, 0.0, 2.5, -1.0, 0.5, f32::NEG_INFINITY, f32::NAN];
    let logits = Tensor::from_vec(row.to_vec(), (1, row.len()), &Device::Cpu).unwrap();
    let temperature = 1.5;
    let requests = draws_of_one_row(temperature, 20_000);
    let mut counts = [0usize; 7];
    for token in gumbel_sample(&logits, &requests).unwrap() {
        counts[token as usize] += 1;
    }
    assert_eq!((counts[5], counts[6]), (0, 0), "-inf and NaN are never drawn");
    let weights: Vec<f64> = row[..5]
        .iter()
        .map(|l| ((l - 2.5) / temperature).exp() as f64)
        .collect();
    let total: f64 = weights.iter().sum();
    let probabilities: Vec<f64> = weights.iter().map(|w| w / total).collect();
    let chi_square = chi_square(&counts[..5], &probabilities);
    // The 99.9th percentile of chi-square with 4 degrees of freedom.
    assert!(chi_square < 18.47, "chi-square {chi_square}: {counts:?}");
    // The same key draws the same token; a wrong row is an error.
    assert_eq!(
        gumbel_sample(&logits, &requests[..50]).unwrap(),
        gumbel_sample(&logits, &requests[..50]).unwrap()
    );
    assert!(gumbel_sample(&logits, &[GumbelRequest { row: 1, ..requests[0] }]).is_err());
}

/// A row with +inf logits draws among them alone, each about as often (their softmax's
/// limit); the finite ones and NaN never.
#[test]
fn a_row_with_infinite_logits_draws_among_those_alone() {
    let row = [1.0f32, f32::INFINITY, 5.0, f32::INFINITY, f32::NAN];
    let logits = Tensor::from_vec(row.to_vec(), (1, row.len()), &Device::Cpu).unwrap();
    let mut counts = [0usize; 5];
    for token in gumbel_sample(&logits, &draws_of_one_row(0.7, 2_000)).unwrap() {
        counts[token as usize] += 1;
    }
    assert_eq!((counts[0], counts[2], counts[4]), (0, 0, 0), "{counts:?}");
    // The 99.9th percentile of chi-square with 1 degree of freedom.
    let chi_square = chi_square(&[counts[1], counts[3]], &[0.5, 0.5]);
    assert!(chi_square < 10.83, "chi-square {chi_square}: {counts:?}");
}

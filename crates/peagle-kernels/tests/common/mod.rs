//! Helpers shared by the kernels' integration tests: the statistics of sampling kernels.

use peagle_kernels::GumbelRequest;

/// `draws` Gumbel-max requests of row 0 at `temperature`, keyed 0, 1, ...: as many
/// independent draws from one row.
pub fn draws_of_one_row(temperature: f32, draws: u64) -> Vec<GumbelRequest> {
    (0..draws)
        .map(|key| GumbelRequest {
            row: 0,
            temperature,
            key,
        })
        .collect()
}

/// Pearson's chi-square of `counts` against the `probabilities` (summing to 1) of the same
/// bins, over the counts' total.
pub fn chi_square(counts: &[usize], probabilities: &[f64]) -> f64 {
    assert_eq!(counts.len(), probabilities.len(), "a probability per bin");
    let total = counts.iter().sum::<usize>() as f64;
    counts
        .iter()
        .zip(probabilities)
        .map(|(&c, p)| (c as f64 - p * total).powi(2) / (p * total))
        .sum()
}

//! What cutting a sampled row's nucleus needs, computed where the rows are: the row's first
//! tokens in sampling's order, with their logits, and sums of the other tokens' weights. On a
//! GPU, sampled verification brings these few values to the host instead of the rows.
//!
//! Sampling's order: the larger logit first under `f32::total_cmp`, the lower index first on a
//! tie. A token's weight is `exp((logit - max) / temperature)` in f32 (within 2 ulps, or 2
//! ulps of the smallest subnormal, of the exact value; `max` is the first token's logit),
//! widened to f64. The other tokens' weights are summed apart by where they fall against the
//! request's thresholds: `above` (w >= hi) and `between` (lo <= w < hi); weights below `lo`
//! and NaN are in neither. `total`, the normaliser of the row's log-probabilities, sums
//! `exp(logit - max)` in f64 over every token. Sums of up to `cols` terms, in any order.

use crate::contiguous::contiguous;
use crate::error::bad_input;
use crate::kernel_constants;
use crate::requested_rows::{apply_to_rows, Issued};
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

/// The most tokens a request may ask for.
pub const MAX_ROW_CANDIDATES: usize = kernel_constants::MAX_ROW_CANDIDATES;

/// One row to take candidates from, and how its weights are computed and split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CandidateRequest {
    pub row: usize,
    pub temperature: f32,
    pub lo: f64,
    pub hi: f64,
}

/// A row's first tokens in sampling's order and what the rest of it weighs.
#[derive(Debug, Clone, PartialEq)]
pub struct RowCandidates {
    /// The first `count` tokens (all of a narrower row's), in order, with their logits.
    pub first: Vec<(u32, f32)>,
    /// The other tokens' weights at least `hi`.
    pub above: f64,
    /// The other tokens' weights at least `lo` and below `hi`.
    pub between: f64,
    /// Every token's `exp(logit - max)`, the temperature aside.
    pub total: f64,
}

/// The first `count` tokens of each requested row of `logits` ([rows, cols], f32 or bf16) and
/// the sums of the others' weights, one result per request, in order.
pub fn row_candidates(logits: &Tensor, requests: &[CandidateRequest], count: usize) -> Result<Vec<RowCandidates>> {
    issue_row_candidates(logits, requests, count)?.read()
}

/// `row_candidates`, issued where the logits are and read later.
pub fn issue_row_candidates(
    logits: &Tensor,
    requests: &[CandidateRequest],
    count: usize,
) -> Result<Issued<RowCandidates>> {
    const OP: &str = "row_candidates";
    if count == 0 || count > MAX_ROW_CANDIDATES {
        return Err(bad_input(
            OP,
            format!("count {count} is not in 1..={MAX_ROW_CANDIDATES}"),
        ));
    }
    let count = count.min(logits.dims2()?.1);
    let op = RowCandidatesOp { requests, count };
    let words = apply_to_rows(OP, logits, requests.iter().map(|r| r.row), &op)?;
    Ok(Issued::new(words, words_per_row(count), RowCandidates::unpacked))
}

/// The words a request's result takes: the tokens, their logits' bits, then the bits of the
/// three sums, low word first.
fn words_per_row(count: usize) -> usize {
    2 * count + 6
}

struct RowCandidatesOp<'a> {
    requests: &'a [CandidateRequest],
    count: usize,
}

impl CustomOp1 for RowCandidatesOp<'_> {
    fn name(&self) -> &'static str {
        "peagle-row-candidates"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, cols) = l.shape().dims2()?;
        let x = contiguous(s.as_slice::<f32>()?, l, "logits")?;
        let words = match self.count {
            0 => vec![0; self.requests.len() * words_per_row(0)],
            count => self
                .requests
                .iter()
                .flat_map(|r| of_row(&x[r.row * cols..][..cols], r, count).packed())
                .collect(),
        };
        Ok((CpuStorage::U32(words), self.shape()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = match self.count {
            0 => crate::cuda::zeros(s, self.requests.len() * words_per_row(0))?,
            count => crate::cuda::row_candidates((s, l), self.requests, count, words_per_row(count))?,
        };
        Ok((out, self.shape()))
    }
}

impl RowCandidatesOp<'_> {
    fn shape(&self) -> Shape {
        Shape::from((self.requests.len(), words_per_row(self.count)))
    }
}

impl RowCandidates {
    /// As `words_per_row` lays a result out.
    fn packed(&self) -> Vec<u32> {
        let tokens = self.first.iter().map(|(t, _)| *t);
        let logits = self.first.iter().map(|(_, l)| l.to_bits());
        let sums = [self.above, self.between, self.total]
            .into_iter()
            .flat_map(|sum| [sum.to_bits() as u32, (sum.to_bits() >> 32) as u32]);
        tokens.chain(logits).chain(sums).collect()
    }

    /// From `words_per_row(count)` words, whose number gives `count`.
    fn unpacked(words: &[u32]) -> Self {
        let count = (words.len() - words_per_row(0)) / 2;
        let (tokens, rest) = words.split_at(count);
        let (logits, sums) = rest.split_at(count);
        let f64_at = |i: usize| f64::from_bits(sums[i] as u64 | (sums[i + 1] as u64) << 32);
        Self {
            first: tokens
                .iter()
                .zip(logits)
                .map(|(&t, &l)| (t, f32::from_bits(l)))
                .collect(),
            above: f64_at(0),
            between: f64_at(2),
            total: f64_at(4),
        }
    }
}

/// The host's computation: a sort of the row, the reference the kernel is tested against.
fn of_row(row: &[f32], request: &CandidateRequest, count: usize) -> RowCandidates {
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
    let max = row[order[0] as usize];
    let (mut above, mut between) = (0.0, 0.0);
    for &i in &order[count..] {
        let scaled = (row[i as usize] - max) / request.temperature;
        let w = ((scaled as f64).exp() as f32) as f64;
        if w >= request.hi {
            above += w;
        } else if w >= request.lo {
            between += w;
        }
    }
    RowCandidates {
        first: order[..count].iter().map(|&i| (i, row[i as usize])).collect(),
        above,
        between,
        total: row.iter().map(|l| ((l - max) as f64).exp()).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_first_tokens_come_in_order_and_the_rest_is_summed_by_threshold() {
        let row = [0.5f32, 2.0, -1.0, 2.0, f32::NEG_INFINITY, 0.0, -0.0, 1.0];
        let logits = Tensor::from_vec([vec![0.0; 8], row.to_vec()].concat(), (2, 8), &Device::Cpu).unwrap();
        let request = CandidateRequest {
            row: 1,
            temperature: 2.0,
            lo: 0.3,
            hi: 0.6,
        };
        let got = row_candidates(&logits, &[request], 3).unwrap();
        // Ties go to the lower index; the rest weigh e^(-0.75) = 0.47, e^(-1) twice = 0.37,
        // e^(-1.5) = 0.22 and 0.
        assert_eq!(got[0].first, [(1, 2.0), (3, 2.0), (7, 1.0)]);
        assert_eq!(got[0].above, 0.0);
        let between = [-0.75f32, -1.0, -1.0].map(|s| (s as f64).exp() as f32 as f64);
        assert_eq!(got[0].between, between.iter().sum::<f64>());
        // -0.0 comes after 0.0 in the total order.
        let all = row_candidates(&logits, &[request], 20).unwrap();
        let order: Vec<u32> = all[0].first.iter().map(|(t, _)| *t).collect();
        assert_eq!(order, [1, 3, 7, 0, 5, 6, 2, 4]);
        assert_eq!((all[0].above, all[0].between), (0.0, 0.0));

        assert!(row_candidates(&logits, &[request], 0).is_err());
        assert!(row_candidates(&logits, &[request], MAX_ROW_CANDIDATES + 1).is_err());
        assert!(row_candidates(&logits, &[CandidateRequest { row: 2, ..request }], 3).is_err());
    }
}

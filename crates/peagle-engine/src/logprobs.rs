//! Log-probabilities of chosen tokens under the target (before temperature and any
//! adjustment), with the most likely alternatives: for committed tokens and for the prompt.

use crate::logit_rows::{host_readable, with_rows};
use crate::nucleus::weight_thresholds;
use crate::request::TokenOutput;
use crate::sequence::Sequence;
use candle_core::{DType, Tensor};
use peagle_kernels::{row_candidates, CandidateRequest, RowCandidates, MAX_ROW_CANDIDATES};
use std::ops::Range;

/// Scores the prompt tokens a prefill chunk at `start` has logits for, the chunk's rows
/// `rows` of the step's `logits`: row i predicts the token at `start + i + 1`. The first
/// prompt token, which nothing predicts, gets no log-probability. Rows are only there (and
/// read) when the sequence asked for prompt log-probabilities.
pub fn score_prompt(seq: &mut Sequence, start: usize, logits: &Tensor, rows: Range<usize>) -> candle_core::Result<()> {
    let Some(top) = seq.prompt_logprobs else {
        return Ok(());
    };
    if seq.prompt_scored >= seq.num_prompt_tokens {
        return Ok(());
    }
    if seq.prompt_scored == 0 {
        seq.prompt_outputs.push(TokenOutput::bare(seq.token_ids[0]));
        seq.prompt_scored = 1;
    }
    let from = seq.prompt_scored;
    let end = (start + rows.len() + 1).min(seq.num_prompt_tokens);
    if end > from {
        let first = rows.start + from - start - 1;
        let tokens = &seq.token_ids[from..end];
        seq.prompt_outputs.extend(scored_rows(tokens, logits, first, top)?);
        seq.prompt_scored = end;
    }
    Ok(())
}

/// The outputs of `tokens` with `top` log-probabilities and their ranks, token i from row
/// `first + i` of `logits`: read in place on the host; on a device, from each row's first
/// tokens and total (`row_candidates`), the tokens' own logits and the count of logits above
/// each, a few values a row.
fn scored_rows(tokens: &[u32], logits: &Tensor, first: usize, top: usize) -> candle_core::Result<Vec<TokenOutput>> {
    let rows = first..first + tokens.len();
    if host_readable(logits) || top > MAX_ROW_CANDIDATES {
        return with_rows(logits, rows, |rows| {
            let mut outputs = token_outputs(tokens, rows.clone(), Some(top));
            for ((output, row), &token) in outputs.iter_mut().zip(rows).zip(tokens) {
                let own = row[token as usize];
                output.rank = Some(row.iter().filter(|&&l| l >= own).count() as u32);
            }
            outputs
        });
    }
    let requests: Vec<CandidateRequest> = rows.map(logprob_request).collect();
    let candidates = row_candidates(logits, &requests, top.max(1))?;
    let ids = Tensor::from_slice(tokens, (tokens.len(), 1), logits.device())?;
    let scored = logits.narrow(0, first, tokens.len())?.contiguous()?;
    let own = scored.gather(&ids, 1)?;
    let ranks = ranks(&scored, &own)?;
    let own: Vec<f32> = own.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
    Ok(tokens
        .iter()
        .zip(own)
        .zip(&candidates)
        .zip(ranks)
        .map(|(((&token, logit), candidates), rank)| TokenOutput {
            rank: Some(rank),
            ..candidate_output(token, logit, candidates, top)
        })
        .collect())
}

/// Rows whose comparisons `ranks` holds at once: a prefill chunk's rows by a vocabulary of
/// comparisons would take gigabytes.
const RANK_ROWS: usize = 256;

/// Each row's rank of its value in `own` ([rows, 1]): the count of the row's logits at least
/// as large (vLLM's rule: a token tied with others ranks last among them), where they lie.
fn ranks(rows: &Tensor, own: &Tensor) -> candle_core::Result<Vec<u32>> {
    let count = rows.dim(0)?;
    let mut ranks = Vec::with_capacity(count);
    for start in (0..count).step_by(RANK_ROWS) {
        let len = RANK_ROWS.min(count - start);
        let at_least = rows.narrow(0, start, len)?.broadcast_ge(&own.narrow(0, start, len)?)?;
        ranks.extend(at_least.to_dtype(DType::U32)?.sum(1)?.to_vec1::<u32>()?);
    }
    Ok(ranks)
}

/// The request for row `row`'s first tokens and total, all that its log-probabilities need.
pub fn logprob_request(row: usize) -> CandidateRequest {
    let (lo, hi) = weight_thresholds(0.0);
    CandidateRequest {
        row,
        temperature: 1.0,
        lo,
        hi,
    }
}

/// Committed tokens with their log-probabilities from the rows that produced them.
pub fn token_outputs<'a>(
    tokens: &[u32],
    rows: impl Iterator<Item = &'a [f32]>,
    logprobs: Option<usize>,
) -> Vec<TokenOutput> {
    tokens
        .iter()
        .zip(rows)
        .map(|(&id, row)| match logprobs {
            None => TokenOutput::bare(id),
            Some(top) => {
                let lp = log_softmax(row);
                let mut order: Vec<usize> = (0..lp.len()).collect();
                let top = top.min(lp.len());
                if top > 0 {
                    order.select_nth_unstable_by(top - 1, |a, b| lp[*b].total_cmp(&lp[*a]).then(a.cmp(b)));
                }
                order.truncate(top);
                order.sort_by(|a, b| lp[*b].total_cmp(&lp[*a]).then(a.cmp(b)));
                TokenOutput {
                    id,
                    logprob: Some(lp[id as usize]),
                    top_logprobs: order.into_iter().map(|i| (i as u32, lp[i])).collect(),
                    rank: None,
                    stops: false,
                }
            }
        })
        .collect()
}

fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_sum = log_sum(row.iter().map(|x| ((x - max) as f64).exp()).sum());
    row.iter().map(|x| x - max - log_sum).collect()
}

/// The log of a row's `sum(exp(logit - max))`, as its log-probabilities subtract it.
fn log_sum(total: f64) -> f32 {
    total.ln() as f32
}

/// The output of `token` (logit `logit`) from a row's first tokens and total on the device
/// (`row_candidates`, at least `top` of them): the log-probabilities `token_outputs` gives
/// from the whole row, but for the last bits of the total, summed in another order.
pub fn candidate_output(token: u32, logit: f32, candidates: &RowCandidates, top: usize) -> TokenOutput {
    let max = candidates.first.first().map_or(0.0, |(_, l)| *l);
    let log_sum = log_sum(candidates.total);
    TokenOutput {
        id: token,
        logprob: Some(logit - max - log_sum),
        top_logprobs: candidates.first[..top.min(candidates.first.len())]
            .iter()
            .map(|&(t, l)| (t, l - max - log_sum))
            .collect(),
        rank: None,
        stops: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::GenerateParams;
    use candle_core::Device;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// A prompt scored in two chunks from logits the host cannot read in place (a strided
    /// tensor stands for a GPU's) gets the host's outputs, ranks included, but for the last
    /// bits of each row's normaliser.
    #[test]
    fn a_prompt_scored_on_a_device_gets_the_hosts_log_probabilities() {
        const VOCAB: usize = 700;
        let mut rng = StdRng::seed_from_u64(4);
        let values: Vec<f32> = (0..9 * VOCAB).map(|_| rng.random::<f32>() * 10.0 - 5.0).collect();
        let logits = Tensor::from_vec(values, (9, VOCAB), &Device::Cpu).unwrap();
        let strided = logits.t().unwrap().contiguous().unwrap().t().unwrap();
        let prompt: Vec<u32> = (0..8).map(|i| (i * 97 + 5) % VOCAB as u32).collect();
        for top in [0, 4] {
            let scored = |logits: &Tensor| {
                let mut seq = Sequence::new(prompt.clone(), GenerateParams::default());
                seq.prompt_logprobs = Some(top);
                // Chunks of 5 and 3 prompt tokens, at rows 1..6 and 6..9 of one step each.
                score_prompt(&mut seq, 0, logits, 1..6).unwrap();
                score_prompt(&mut seq, 5, logits, 6..9).unwrap();
                seq.prompt_outputs
            };
            let (host, device) = (scored(&logits), scored(&strided));
            assert_eq!(host.len(), prompt.len());
            // Each token's rank: the logits at least its own in its row.
            let rows: Vec<Vec<f32>> = logits.to_vec2().unwrap();
            for (i, output) in host.iter().enumerate() {
                let want = i.checked_sub(1).map(|r| {
                    let row = &rows[1 + r];
                    let own = row[prompt[i] as usize];
                    row.iter().filter(|&&l| l >= own).count() as u32
                });
                assert_eq!(output.rank, want, "token {i}");
            }
            assert!(host[1..].iter().any(|o| o.rank > Some(1)), "ranks past the first");
            for (got, want) in device.iter().zip(&host) {
                assert_eq!((got.id, got.rank), (want.id, want.rank));
                assert_eq!(got.logprob.is_some(), want.logprob.is_some());
                if let (Some(g), Some(w)) = (got.logprob, want.logprob) {
                    assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
                }
                assert_eq!(got.top_logprobs.len(), want.top_logprobs.len());
                for (g, w) in got.top_logprobs.iter().zip(&want.top_logprobs) {
                    assert!(g.0 == w.0 && (g.1 - w.1).abs() < 1e-5, "{got:?} vs {want:?}");
                }
            }
        }
    }
}

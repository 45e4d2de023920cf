//! Log-probabilities of chosen tokens under the target (before temperature), with the most
//! likely alternatives: for committed tokens and for the prompt.

use crate::logit_rows::with_rows;
use crate::request::TokenOutput;
use crate::sequence::Sequence;
use candle_core::Tensor;
use peagle_kernels::RowCandidates;
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
        seq.prompt_outputs.push(TokenOutput {
            id: seq.token_ids[0],
            logprob: None,
            top_logprobs: Vec::new(),
            stops: false,
        });
        seq.prompt_scored = 1;
    }
    let from = seq.prompt_scored;
    let end = (start + rows.len() + 1).min(seq.num_prompt_tokens);
    if end > from {
        let first = rows.start + from - start - 1;
        let tokens = &seq.token_ids[from..end];
        let scored = with_rows(logits, first..first + tokens.len(), |rows| {
            token_outputs(tokens, rows, Some(top))
        })?;
        seq.prompt_outputs.extend(scored);
        seq.prompt_scored = end;
    }
    Ok(())
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
            None => TokenOutput {
                id,
                logprob: None,
                top_logprobs: Vec::new(),
                stops: false,
            },
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
        stops: false,
    }
}

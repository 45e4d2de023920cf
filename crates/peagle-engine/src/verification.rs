//! Sampling and verification of one step's logits: each scheduled sequence's rows choose its
//! tokens (a prompt's first token, or the accepted drafts and one target token of a
//! verification window), which are committed to the sequence.

use crate::error::GenerateError;
use crate::penalties::adjusted_rows;
use crate::request::TokenOutput;
use crate::scheduler::Work;
use crate::sequence::Sequence;
use crate::spec_stats::SpecStats;
use crate::verifier::verify;
use candle_core::Tensor;
use peagle_models::SequenceRows;

/// What a step committed for one sequence.
#[derive(Debug, Clone, Copy)]
pub struct Committed {
    /// Position of the step's first target row for the sequence.
    pub start: usize,
    /// Leading target rows whose next tokens are now committed: the drafter's new slots.
    pub rows: usize,
    /// Whether a token was chosen (not a prompt chunk short of the prompt's end), so the
    /// sequence wants new drafts.
    pub sampled: bool,
}

/// Chooses and commits each sequence's tokens from `logits` [logit rows, vocab], where
/// `rows[i]` says which rows are sequence i's; counts every verification in `stats`.
pub fn sample_and_verify(
    work: &mut [(&mut Sequence, Work)],
    logits: &Tensor,
    rows: &[SequenceRows],
    eos_token_ids: &[u32],
    max_model_len: usize,
    stats: &mut SpecStats,
) -> Result<Vec<Committed>, GenerateError> {
    let logits: Vec<Vec<f32>> = logits.to_vec2()?;
    let mut committed = Vec::with_capacity(work.len());
    for ((seq, w), placed) in work.iter_mut().zip(rows) {
        let (start, n) = w.span(seq);
        let window = &logits[placed.logits.clone()];
        if let Work::Prefill(_) = w {
            score_prompt(seq, start, window);
        }
        committed.push(match w {
            Work::Prefill(_) if !seq.samples_after(start + n) => {
                seq.num_cached = start + n;
                Committed {
                    start,
                    rows: n,
                    sampled: false,
                }
            }
            Work::Prefill(_) => {
                let row = std::slice::from_ref(&window[window.len() - 1]);
                let adjusted = adjusted_rows(seq, &[], row, eos_token_ids);
                let token = verify(&[], &adjusted, None, &seq.params.sampling, &seq.sampler, seq.len());
                seq.num_cached = seq.len();
                let outputs = token_outputs(&token.tokens, row, seq.logprobs);
                seq.commit(&outputs, eos_token_ids, max_model_len);
                Committed {
                    start,
                    rows: n,
                    sampled: true,
                }
            }
            Work::Decode => {
                let drafts = std::mem::take(&mut seq.drafts);
                let adjusted = adjusted_rows(seq, &drafts, window, eos_token_ids);
                let verdict = verify(&drafts, &adjusted, None, &seq.params.sampling, &seq.sampler, start + 1);
                seq.spec_stats.record(drafts.len(), verdict.accepted);
                stats.record(drafts.len(), verdict.accepted);
                seq.num_cached = start + verdict.accepted + 1;
                let outputs = token_outputs(&verdict.tokens, window, seq.logprobs);
                seq.commit(&outputs, eos_token_ids, max_model_len);
                Committed {
                    start,
                    rows: verdict.accepted + 1,
                    sampled: true,
                }
            }
        });
    }
    Ok(committed)
}

/// Scores the prompt tokens a prefill chunk at `start` has logits for: row i predicts the
/// token at `start + i + 1`. The first prompt token, which nothing predicts, gets no
/// log-probability. Rows are only there when the sequence asked for prompt log-probabilities.
fn score_prompt(seq: &mut Sequence, start: usize, rows: &[Vec<f32>]) {
    let Some(top) = seq.prompt_logprobs else { return };
    if seq.prompt_scored >= seq.num_prompt_tokens {
        return;
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
        let scored = token_outputs(&seq.token_ids[from..end], &rows[from - start - 1..], Some(top));
        seq.prompt_outputs.extend(scored);
        seq.prompt_scored = end;
    }
}

/// Committed tokens with their log-probabilities from the rows that produced them.
fn token_outputs(tokens: &[u32], rows: &[Vec<f32>], logprobs: Option<usize>) -> Vec<TokenOutput> {
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
    let log_sum = row.iter().map(|x| ((x - max) as f64).exp()).sum::<f64>().ln() as f32;
    row.iter().map(|x| x - max - log_sum).collect()
}

//! The choices of a step's rows made where its logits are, when the host cannot read them in
//! place (on a GPU): a row that nothing adjusts crosses as a token id, or as the few values its
//! cut or its log-probabilities need (its first tokens and sums, `row_candidates`), instead of
//! a vocabulary's worth.
//!
//! How a row chooses depends only on its sequence's parameters and how many tokens come
//! before it, never on the step, so a window's rows choose as the same positions would in
//! plain decoding:
//! - greedy: the row's argmax (`argmax_rows`), the token the host's argmax finds;
//! - sampled with a top-k, top-p or min-p cut: the row's first tokens and the rest's sums
//!   (`row_candidates`), from which the host cuts the nucleus exactly as from the row and
//!   draws with the same randomness; a cut they leave undecided reads the row;
//! - sampled with no cut: a Gumbel-max draw on the device (`gumbel_sample`), keyed by the
//!   sequence's seed and the position. It follows the same distribution as the host's draw
//!   but is not the same draw, so a seeded request's tokens on a GPU differ from the CPU's.

use crate::logit_rows::host_readable;
use crate::logprobs::candidate_output;
use crate::nucleus::{nucleus_of_candidates, weight_thresholds};
use crate::rejection_sampler::Window;
use crate::request::TokenOutput;
use crate::sequence::Sequence;
use candle_core::{DType, Result, Tensor};
use peagle_kernels::{
    argmax_rows, gumbel_sample, row_candidates, CandidateRequest, GumbelRequest, RowCandidates, MAX_ROW_CANDIDATES,
};

/// Tokens the device orders for a sampled row with no top-k: enough for a peaked row's
/// nucleus, a few KiB a row.
const FIRST_COUNT: usize = 256;

/// How a row chooses on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Argmax,
    Cut,
    Gumbel,
}

/// What the device gave for a row: its token where the device chose it, and its first tokens
/// and sums where its cut or its log-probabilities need them.
pub struct Choice {
    token: Option<u32>,
    candidates: Option<RowCandidates>,
}

impl Choice {
    /// The row's token, where the device's values decide it: the sequence's choice for the
    /// token at `position`.
    pub fn token(&self, seq: &Sequence, position: usize, vocab: usize) -> Option<u32> {
        if self.token.is_some() {
            return self.token;
        }
        let kept = nucleus_of_candidates(self.candidates.as_ref()?, vocab, &seq.params.sampling)?;
        Some(seq.sampler.draw(&kept, position))
    }

    /// The output of `token`, chosen from row `row` of `logits`, with the log-probabilities
    /// the sequence asked for; a token outside the row's first tokens has its logit read.
    pub fn output(&self, token: u32, seq: &Sequence, logits: &Tensor, row: usize) -> Result<TokenOutput> {
        let (Some(top), Some(candidates)) = (seq.logprobs, &self.candidates) else {
            return Ok(TokenOutput {
                id: token,
                logprob: None,
                top_logprobs: Vec::new(),
                stops: false,
            });
        };
        let logit = match candidates.first.iter().find(|(t, _)| *t == token) {
            Some(&(_, logit)) => logit,
            None => logits
                .get(row)?
                .get(token as usize)?
                .to_dtype(DType::F32)?
                .to_scalar()?,
        };
        Ok(candidate_output(token, logit, candidates, top))
    }
}

/// The device's choice for each row of `logits` ([rows, vocab]) that a window's sequence lets
/// the device make, indexed by row; none at all where the host reads the rows in place.
pub fn device_choices(logits: &Tensor, windows: &[Window]) -> Result<Vec<Option<Choice>>> {
    let rows = logits.dim(0)?;
    let mut choices: Vec<Option<Choice>> = (0..rows).map(|_| None).collect();
    if host_readable(logits) {
        return Ok(choices);
    }
    let mut argmax = Vec::new();
    let mut cut = Vec::new();
    let mut gumbel = Vec::new();
    let mut count = 1;
    for w in windows {
        let seq = w.seq;
        let params = &seq.params.sampling;
        for i in 0..=w.drafts.len() {
            let row = w.first_row + i;
            let Some(way) = way(seq, seq.generated().len() + i) else {
                continue;
            };
            choices[row] = Some(Choice {
                token: None,
                candidates: None,
            });
            match way {
                Way::Argmax => argmax.push(row),
                Way::Gumbel => gumbel.push(GumbelRequest {
                    row,
                    temperature: params.temperature,
                    key: seq.sampler.key(w.position + i),
                }),
                Way::Cut => {}
            }
            let first_count = match way {
                Way::Cut if params.top_k > 0 => params.top_k,
                Way::Cut => FIRST_COUNT,
                _ => 0,
            };
            if first_count > 0 || seq.logprobs.is_some() {
                count = count.max(first_count).max(seq.logprobs.unwrap_or(0));
                // A row that does not cut needs only the order and the total.
                let (lo, hi) = weight_thresholds(params.min_p);
                cut.push(CandidateRequest {
                    row,
                    temperature: if way == Way::Cut { params.temperature } else { 1.0 },
                    lo,
                    hi,
                });
            }
        }
    }
    if !argmax.is_empty() {
        let tokens = argmax_rows(logits)?.to_vec1::<u32>()?;
        for row in argmax {
            at(&mut choices, row).token = Some(tokens[row]);
        }
    }
    if !gumbel.is_empty() {
        for (request, token) in gumbel.iter().zip(gumbel_sample(logits, &gumbel)?) {
            at(&mut choices, request.row).token = Some(token);
        }
    }
    if !cut.is_empty() {
        for (request, candidates) in cut.iter().zip(row_candidates(logits, &cut, count)?) {
            at(&mut choices, request.row).candidates = Some(candidates);
        }
    }
    Ok(choices)
}

fn at(choices: &mut [Option<Choice>], row: usize) -> &mut Choice {
    choices[row].as_mut().expect("a row the device chooses")
}

/// How the row after `generated` tokens of `seq` chooses on the device, or None where the host
/// needs the row: penalties, logit bias or held-back stop tokens adjust it, or it needs more
/// first tokens (a top-k, a count of log-probabilities) than the device orders.
fn way(seq: &Sequence, generated: usize) -> Option<Way> {
    let params = &seq.params.sampling;
    let adjusted = !params.penalties.is_off() || generated < seq.params.min_tokens;
    if adjusted || seq.logprobs.is_some_and(|top| top > MAX_ROW_CANDIDATES) {
        return None;
    }
    if params.is_greedy() {
        Some(Way::Argmax)
    } else if params.top_k == 0 && params.top_p >= 1.0 && params.min_p == 0.0 {
        Some(Way::Gumbel)
    } else if params.top_k <= MAX_ROW_CANDIDATES {
        Some(Way::Cut)
    } else {
        None
    }
}

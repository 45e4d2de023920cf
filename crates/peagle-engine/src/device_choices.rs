//! The choices of a step's rows made where its logits are, when the host cannot read them in
//! place (on a GPU): a row that nothing adjusts and whose log-probabilities nobody asked for
//! crosses as a token id, or as the few values its cut needs, instead of a vocabulary's worth.
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
use crate::nucleus::{nucleus_of_candidates, weight_thresholds};
use crate::rejection_sampler::Window;
use crate::sequence::Sequence;
use candle_core::{Result, Tensor};
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

/// What the device gave for a row.
pub enum Choice {
    Token(u32),
    Candidates(RowCandidates),
}

impl Choice {
    /// The row's token, where the device's values decide it: the sequence's choice for the
    /// token at `position`.
    pub fn token(&self, seq: &Sequence, position: usize, vocab: usize) -> Option<u32> {
        match self {
            Self::Token(token) => Some(*token),
            Self::Candidates(candidates) => nucleus_of_candidates(candidates, vocab, &seq.params.sampling)
                .map(|kept| seq.sampler.draw(&kept, position)),
        }
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
        for i in 0..=w.drafts.len() {
            let row = w.first_row + i;
            match way(seq, seq.generated().len() + i) {
                Some(Way::Argmax) => argmax.push(row),
                Some(Way::Cut) => {
                    let params = &seq.params.sampling;
                    let (lo, hi) = weight_thresholds(params.min_p);
                    count = count.max(if params.top_k > 0 { params.top_k } else { FIRST_COUNT });
                    cut.push(CandidateRequest {
                        row,
                        temperature: params.temperature,
                        lo,
                        hi,
                    });
                }
                Some(Way::Gumbel) => gumbel.push(GumbelRequest {
                    row,
                    temperature: seq.params.sampling.temperature,
                    key: seq.sampler.key(w.position + i),
                }),
                None => {}
            }
        }
    }
    if !argmax.is_empty() {
        let tokens = argmax_rows(logits)?.to_vec1::<u32>()?;
        for row in argmax {
            choices[row] = Some(Choice::Token(tokens[row]));
        }
    }
    if !gumbel.is_empty() {
        for (request, token) in gumbel.iter().zip(gumbel_sample(logits, &gumbel)?) {
            choices[request.row] = Some(Choice::Token(token));
        }
    }
    if !cut.is_empty() {
        for (request, candidates) in cut.iter().zip(row_candidates(logits, &cut, count)?) {
            choices[request.row] = Some(Choice::Candidates(candidates));
        }
    }
    Ok(choices)
}

/// How the row after `generated` tokens of `seq` chooses on the device, or None where the host
/// needs the row: penalties, logit bias or held-back stop tokens adjust it, log-probabilities
/// are asked for, or a top-k too long for the device's order.
fn way(seq: &Sequence, generated: usize) -> Option<Way> {
    let params = &seq.params.sampling;
    if seq.logprobs.is_some() || !params.penalties.is_off() || generated < seq.params.min_tokens {
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

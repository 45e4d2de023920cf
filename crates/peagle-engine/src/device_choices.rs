//! The choices of a step's rows made where its logits are, when the host cannot read them in
//! place (on a GPU): a row crosses as a token id, or as the few values its cut or its
//! log-probabilities need (its first tokens and sums, `row_candidates`), instead of a
//! vocabulary's worth.
//!
//! Rows that penalties, logit bias or held-back stop tokens adjust choose from their copies
//! adjusted on the device (`device_adjustments`) as any row does; their log-probabilities
//! stay those of the step's own rows.
//!
//! How a row chooses depends only on its sequence's parameters, never on the step, so a
//! window's rows choose as the same positions would in plain decoding:
//! - greedy: the row's argmax (`argmax_rows`), the token the host's argmax finds;
//! - sampled with a top-k, top-p or min-p cut: the row's first tokens and the rest's sums
//!   (`row_candidates`), from which the host cuts the nucleus exactly as from the row and
//!   draws with the same randomness; a cut they leave undecided reads the row;
//! - sampled with no cut: a Gumbel-max draw on the device (`gumbel_sample`), keyed by the
//!   sequence's seed and the position. It follows the same distribution as the host's draw
//!   but is not the same draw, so a seeded request's tokens on a GPU differ from the CPU's.

use crate::device_adjustments::AdjustedRows;
use crate::logit_rows::{host_readable, with_rows};
use crate::logprobs::{candidate_output, logprob_request};
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

/// How a sequence's rows choose on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Argmax,
    Cut,
    Gumbel,
}

/// What the device gave for a row: its token where the device chose it, and the first tokens
/// and sums that its cut and its log-probabilities need.
pub struct Choice {
    /// The values the token is chosen from, [1, vocab]: the row of the step's logits, or its
    /// adjusted copy.
    values: Tensor,
    /// The row of the step's logits, [1, vocab]: what log-probabilities are of.
    raw: Tensor,
    token: Option<u32>,
    /// From `values`, for the cut.
    candidates: Option<RowCandidates>,
    /// From `raw`, for log-probabilities.
    logprob_candidates: Option<RowCandidates>,
}

impl Choice {
    /// The sequence's token at `position`: the device's, or the cut's from the device's values,
    /// or, where those leave the cut undecided, drawn from the row read.
    pub fn token(&self, seq: &Sequence, position: usize) -> Result<u32> {
        if let Some(token) = self.token {
            return Ok(token);
        }
        let params = &seq.params.sampling;
        let vocab = self.values.dim(1)?;
        if let Some(kept) = self
            .candidates
            .as_ref()
            .and_then(|c| nucleus_of_candidates(c, vocab, params))
        {
            return Ok(seq.sampler.draw(&kept, position));
        }
        with_rows(&self.values, 0..1, |mut row| {
            seq.sampler.sample(row.next().expect("one row"), params, position)
        })
    }

    /// The output of `token` with the log-probabilities the sequence asked for; a token
    /// outside the row's first tokens has its logit read.
    pub fn output(&self, token: u32, seq: &Sequence) -> Result<TokenOutput> {
        let (Some(top), Some(candidates)) = (seq.logprobs, &self.logprob_candidates) else {
            return Ok(TokenOutput {
                id: token,
                logprob: None,
                top_logprobs: Vec::new(),
                stops: false,
            });
        };
        let logit = match candidates.first.iter().find(|(t, _)| *t == token) {
            Some(&(_, logit)) => logit,
            None => self
                .raw
                .get(0)?
                .get(token as usize)?
                .to_dtype(DType::F32)?
                .to_scalar()?,
        };
        Ok(candidate_output(token, logit, candidates, top))
    }
}

/// The device's choice for each row of `logits` ([rows, vocab], f32 or bf16) that a window's sequence
/// lets the device make, indexed by row; none at all where the host reads the rows in place.
/// `eos` are the tokens `min_tokens` holds back with a sequence's stop tokens.
pub fn device_choices(logits: &Tensor, windows: &[Window], eos: &[u32]) -> Result<Vec<Option<Choice>>> {
    let rows = logits.dim(0)?;
    let mut choices: Vec<Option<Choice>> = (0..rows).map(|_| None).collect();
    if host_readable(logits) {
        return Ok(choices);
    }
    let windows: Vec<(&Window, Way)> = windows.iter().filter_map(|w| Some((w, way(w.seq)?))).collect();
    let adjusted = AdjustedRows::new(logits, windows.iter().map(|(w, _)| *w), eos)?;
    let mut on_logits = Launches::default();
    let mut on_adjusted = Launches::default();
    for &(w, way) in &windows {
        let seq = w.seq;
        for i in 0..=w.drafts.len() {
            let (row, position) = (w.first_row + i, w.position + i);
            let raw = logits.narrow(0, row, 1)?;
            let values = match (&adjusted.tensor, adjusted.index[row]) {
                (Some(copy), Some(at)) => {
                    on_adjusted.choose(row, at, way, seq, position, None);
                    if let Some(top) = seq.logprobs {
                        on_logits.logprobs(row, row, top);
                    }
                    copy.narrow(0, at, 1)?
                }
                _ => {
                    on_logits.choose(row, row, way, seq, position, seq.logprobs);
                    raw.clone()
                }
            };
            choices[row] = Some(Choice {
                values,
                raw,
                token: None,
                candidates: None,
                logprob_candidates: None,
            });
        }
    }
    on_logits.run(logits, &mut choices)?;
    if let Some(copy) = &adjusted.tensor {
        on_adjusted.run(copy, &mut choices)?;
    }
    Ok(choices)
}

/// How the rows of `seq` choose on the device, or None where the host needs them: they need
/// more first tokens (a top-k, a count of log-probabilities) than the device orders.
fn way(seq: &Sequence) -> Option<Way> {
    let params = &seq.params.sampling;
    if seq.logprobs.is_some_and(|top| top > MAX_ROW_CANDIDATES) {
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

/// What a row's first tokens and sums serve.
#[derive(Debug, Clone, Copy)]
struct Serves {
    cut: bool,
    logprobs: bool,
}

/// The device's work over the rows of one tensor, each with the step row whose choice its
/// result goes to.
#[derive(Default)]
struct Launches {
    argmax: Vec<(usize, usize)>,
    gumbel: Vec<(usize, GumbelRequest)>,
    candidates: Vec<(usize, Serves, CandidateRequest)>,
    count: usize,
}

impl Launches {
    /// Step row `row`, the tensor's row `at`, chooses the token at `position` of `seq` by
    /// `way`, with `logprobs` first tokens when its log-probabilities are of this row.
    fn choose(&mut self, row: usize, at: usize, way: Way, seq: &Sequence, position: usize, logprobs: Option<usize>) {
        let params = &seq.params.sampling;
        match way {
            Way::Argmax => self.argmax.push((row, at)),
            Way::Gumbel => self.gumbel.push((
                row,
                GumbelRequest {
                    row: at,
                    temperature: params.temperature,
                    key: seq.sampler.key(position),
                },
            )),
            Way::Cut => {
                let (lo, hi) = weight_thresholds(params.min_p);
                let serves = Serves {
                    cut: true,
                    logprobs: logprobs.is_some(),
                };
                let request = CandidateRequest {
                    row: at,
                    temperature: params.temperature,
                    lo,
                    hi,
                };
                self.candidates.push((row, serves, request));
                let first = if params.top_k > 0 { params.top_k } else { FIRST_COUNT };
                self.count = self.count.max(first).max(logprobs.unwrap_or(0));
                return;
            }
        }
        if let Some(top) = logprobs {
            self.logprobs(row, at, top);
        }
    }

    /// Step row `row` takes its `top` log-probabilities from the tensor's row `at`: a row
    /// that does not cut needs only the order and the total.
    fn logprobs(&mut self, row: usize, at: usize, top: usize) {
        let serves = Serves {
            cut: false,
            logprobs: true,
        };
        self.candidates.push((row, serves, logprob_request(at)));
        self.count = self.count.max(top);
    }

    /// Runs the work over `tensor`'s rows and gives each result to its row's choice.
    fn run(&self, tensor: &Tensor, choices: &mut [Option<Choice>]) -> Result<()> {
        if !self.argmax.is_empty() {
            let rows: Vec<u32> = self.argmax.iter().map(|&(_, at)| at as u32).collect();
            for (&(row, _), token) in self.argmax.iter().zip(argmax_rows(tensor, &rows)?) {
                at(choices, row).token = Some(token);
            }
        }
        if !self.gumbel.is_empty() {
            let requests: Vec<GumbelRequest> = self.gumbel.iter().map(|(_, r)| *r).collect();
            for ((row, _), token) in self.gumbel.iter().zip(gumbel_sample(tensor, &requests)?) {
                at(choices, *row).token = Some(token);
            }
        }
        if !self.candidates.is_empty() {
            let requests: Vec<CandidateRequest> = self.candidates.iter().map(|(_, _, r)| *r).collect();
            let results = row_candidates(tensor, &requests, self.count.max(1))?;
            for ((row, serves, _), candidates) in self.candidates.iter().zip(results) {
                let choice = at(choices, *row);
                if serves.cut {
                    choice.candidates = Some(candidates.clone());
                }
                if serves.logprobs {
                    choice.logprob_candidates = Some(candidates);
                }
            }
        }
        Ok(())
    }
}

fn at(choices: &mut [Option<Choice>], row: usize) -> &mut Choice {
    choices[row].as_mut().expect("a row the device chooses")
}

//! The choices of a step's rows made where its logits are, when the host cannot read them in
//! place (on a GPU): a row crosses as a token id, or as the few values its cut or its
//! log-probabilities need (its first tokens and sums, `row_candidates`), instead of a
//! vocabulary's worth.
//!
//! Rows that penalties, logit bias or held-back stop tokens adjust choose from their copies
//! adjusted on the device (`device_adjustments`) as any row does; their log-probabilities
//! stay those of the step's own rows.
//!
//! The choices are issued before the drafts the rows verify are on the host, and read after:
//! only the adjusted rows, whose copies depend on the drafts, are chosen at the read.
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

use crate::adjustments::adjusts_row;
use crate::device_adjustments::AdjustedRows;
use crate::logit_rows::{host_readable, with_rows};
use crate::logprobs::{candidate_output, logprob_request};
use crate::nucleus::{nucleus_of_candidates, weight_thresholds};
use crate::request::TokenOutput;
use crate::sequence::Sequence;
use crate::window::{Window, WindowRows};
use candle_core::{DType, Result, Tensor};
use peagle_kernels::{
    issue_argmax_rows, issue_gumbel_sample, issue_row_candidates, CandidateRequest, GumbelRequest, Issued,
    RowCandidates, MAX_ROW_CANDIDATES,
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
            return Ok(TokenOutput::bare(token));
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

/// The device's choices of a step's rows, issued behind the forward that makes its logits,
/// before the drafts its windows verify are on the host: reading the drafts then waits for both.
/// Only rows that adjustments change (`adjusts_row`) wait for the drafts, which their
/// adjusted copies depend on; they choose when the choices are read.
pub struct IssuedChoices {
    logits: Tensor,
    /// Where each window the choices were issued for begins, its rows and its position.
    windows: Vec<(usize, usize, usize)>,
    /// Each step row's choice, its token and first tokens to come; None where the host reads
    /// the row.
    choices: Vec<Option<Choice>>,
    on_logits: IssuedLaunches,
}

impl IssuedChoices {
    /// Issues the device's work over the rows of `logits` ([rows, vocab], f32 or bf16) whose
    /// sequence lets the device choose them: the choice of each row no adjustment changes, and
    /// the first tokens of each adjusted row whose log-probabilities are asked for (the row
    /// itself chooses at `read`). Nothing where the host reads the rows in place.
    pub fn issue(logits: &Tensor, windows: &[WindowRows]) -> Result<Self> {
        let rows = logits.dim(0)?;
        let mut choices: Vec<Option<Choice>> = (0..rows).map(|_| None).collect();
        let mut on_logits = Launches::default();
        let on_device = match host_readable(logits) {
            true => &[][..],
            false => windows,
        };
        for w in on_device {
            let Some(way) = way(w.seq) else {
                continue;
            };
            let seq = w.seq;
            for i in 0..w.len {
                let (row, position) = (w.first_row + i, w.position + i);
                match adjusts_row(seq, i) {
                    true => {
                        if let Some(top) = seq.logprobs {
                            on_logits.logprobs(row, row, top);
                        }
                    }
                    false => on_logits.choose(row, row, way, seq, position, seq.logprobs),
                }
                let raw = logits.narrow(0, row, 1)?;
                choices[row] = Some(Choice {
                    values: raw.clone(),
                    raw,
                    token: None,
                    candidates: None,
                    logprob_candidates: None,
                });
            }
        }
        Ok(Self {
            logits: logits.clone(),
            windows: windows.iter().map(|w| (w.first_row, w.len, w.position)).collect(),
            choices,
            on_logits: on_logits.issue(logits)?,
        })
    }

    /// The choice of each row, indexed by row, once `windows` (those the choices were issued
    /// for, their drafts now read) are known: the adjusted rows choose from their copies
    /// adjusted on the device, `eos` being the tokens `min_tokens` holds back with a
    /// sequence's stop tokens.
    pub fn read(self, windows: &[Window], eos: &[u32]) -> Result<Vec<Option<Choice>>> {
        let issued_for = windows.iter().map(|w| (w.first_row, w.drafts.len() + 1, w.position));
        if !issued_for.eq(self.windows.iter().copied()) {
            candle_core::bail!("choices issued for other windows than those verified");
        }
        let mut choices = self.choices;
        self.on_logits.read(&mut choices)?;
        if host_readable(&self.logits) {
            return Ok(choices);
        }
        let windows: Vec<(&Window, Way)> = windows.iter().filter_map(|w| Some((w, way(w.seq)?))).collect();
        let adjusted = AdjustedRows::new(&self.logits, windows.iter().map(|(w, _)| *w), eos)?;
        let Some(copy) = &adjusted.tensor else {
            return Ok(choices);
        };
        let mut on_adjusted = Launches::default();
        for (w, way) in windows {
            for i in 0..=w.drafts.len() {
                let row = w.first_row + i;
                if let Some(at) = adjusted.index[row] {
                    on_adjusted.choose(row, at, way, w.seq, w.position + i, None);
                    at_row(&mut choices, row).values = copy.narrow(0, at, 1)?;
                }
            }
        }
        on_adjusted.issue(copy)?.read(&mut choices)?;
        Ok(choices)
    }
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

    /// Issues the work over `tensor`'s rows.
    fn issue(self, tensor: &Tensor) -> Result<IssuedLaunches> {
        let argmax = match self.argmax.is_empty() {
            true => None,
            false => {
                let rows: Vec<u32> = self.argmax.iter().map(|&(_, at)| at as u32).collect();
                Some(issue_argmax_rows(tensor, &rows)?)
            }
        };
        let gumbel = match self.gumbel.is_empty() {
            true => None,
            false => {
                let requests: Vec<GumbelRequest> = self.gumbel.iter().map(|(_, r)| *r).collect();
                Some(issue_gumbel_sample(tensor, &requests)?)
            }
        };
        let candidates = match self.candidates.is_empty() {
            true => None,
            false => {
                let requests: Vec<CandidateRequest> = self.candidates.iter().map(|(_, _, r)| *r).collect();
                Some(issue_row_candidates(tensor, &requests, self.count.max(1))?)
            }
        };
        Ok(IssuedLaunches {
            launches: self,
            argmax,
            gumbel,
            candidates,
        })
    }
}

/// `Launches` issued, their results to be read.
struct IssuedLaunches {
    launches: Launches,
    argmax: Option<Issued<u32>>,
    gumbel: Option<Issued<u32>>,
    candidates: Option<Issued<RowCandidates>>,
}

impl IssuedLaunches {
    /// Reads the results and gives each to its row's choice.
    fn read(self, choices: &mut [Option<Choice>]) -> Result<()> {
        let launches = self.launches;
        if let Some(tokens) = self.argmax {
            for (&(row, _), token) in launches.argmax.iter().zip(tokens.read()?) {
                at_row(choices, row).token = Some(token);
            }
        }
        if let Some(tokens) = self.gumbel {
            for ((row, _), token) in launches.gumbel.iter().zip(tokens.read()?) {
                at_row(choices, *row).token = Some(token);
            }
        }
        if let Some(results) = self.candidates {
            for ((row, serves, _), candidates) in launches.candidates.iter().zip(results.read()?) {
                let choice = at_row(choices, *row);
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

fn at_row(choices: &mut [Option<Choice>], row: usize) -> &mut Choice {
    choices[row].as_mut().expect("a row the device chooses")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::GenerateParams;
    use candle_core::Device;

    /// Only the rows an adjustment changes wait for the drafts: here the two whose stop tokens
    /// `min_tokens` holds back. The others' argmax is issued with the forward, and every row
    /// ends with a token from the device.
    #[test]
    fn only_adjusted_rows_wait_for_the_drafts() {
        let values: Vec<f32> = (0..4 * 8).map(|i| ((i * 7) % 11) as f32).collect();
        let logits = Tensor::from_vec(values, (4, 8), &Device::Cpu).unwrap();
        // Strided, the host cannot read it in place, as a GPU's logits.
        let strided = logits.t().unwrap().contiguous().unwrap().t().unwrap();
        let params = GenerateParams {
            max_tokens: 10,
            min_tokens: 2,
            ..GenerateParams::default()
        };
        let seq = Sequence::new(vec![1, 2, 3], params);
        let rows = WindowRows {
            first_row: 0,
            len: 4,
            position: 3,
            seq: &seq,
        };
        let issued = IssuedChoices::issue(&strided, &[rows]).unwrap();
        let issued_rows: Vec<usize> = issued.on_logits.launches.argmax.iter().map(|&(row, _)| row).collect();
        assert_eq!(issued_rows, [2, 3]);
        let window = Window {
            first_row: 0,
            drafts: &[1, 1, 1],
            position: 3,
            seq: &seq,
        };
        let choices = issued.read(&[window], &[0]).unwrap();
        assert!(choices.iter().all(|c| c.as_ref().is_some_and(|c| c.token.is_some())));
    }
}

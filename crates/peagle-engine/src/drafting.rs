//! The drafting round of a step: every drafting sequence hands the drafter the target states
//! of its newly committed tokens, and one proposer call drafts for all of them. The states are
//! projected to the drafter's width as soon as the forward is issued (`project`), while the
//! host waits for it anyway, so a graph's captured states are read before its next replay and
//! the drafting that follows verification issues one launch fewer. The drafts stay on the
//! device: the next step's forward takes them there, and `read_drafts` copies them to the host
//! while it runs.
//!
//! With k = 0 (speculation suspended) the drafter does not run: each sequence keeps the
//! projected states the drafter has not read as a backlog, and the next step that drafts catches the drafter up
//! on them in the same pass. With prefix caching on, a sequence that finishes catches its
//! drafter up in its last step, drafting nothing: a cached block serves a drafting request only
//! with the drafter's rows in it, and otherwise blocks computed while speculation was
//! suspended would never serve one.

use crate::error::GenerateError;
use crate::proposer::{DraftRequest, Proposer};
use crate::scheduler::Work;
use crate::sequence::{DrafterBacklog, Sequence};
use crate::verification::Committed;
use candle_core::Tensor;
use peagle_models::{DeviceIds, SequenceRows};
use std::ops::Range;

pub struct Drafting {
    proposer: Box<dyn Proposer>,
    /// Prefix caching is on: finishing sequences catch their drafter up.
    complete_finished: bool,
}

/// A drafter input for one scheduled sequence.
struct DraftInput {
    index: usize,
    start: usize,
    tokens: Vec<u32>,
    /// Its rows of the round's target states.
    states: Range<usize>,
    draft: bool,
}

impl Drafting {
    pub fn new(proposer: Box<dyn Proposer>, complete_finished: bool) -> Self {
        Self {
            proposer,
            complete_finished,
        }
    }

    /// Most drafts per step (0 without a drafter).
    pub fn k(&self) -> usize {
        self.proposer.k()
    }

    /// Whether `seq` runs through the drafter at all (and so needs the target's states).
    pub fn drafts_for(&self, seq: &Sequence) -> bool {
        self.k() > 0 && seq.speculate
    }

    /// The drafter's hidden input from the captured rows of a step's forward `aux_hidden`
    /// (`Proposer::project`), for `run`; None without a drafter or captured rows.
    pub fn project(&self, aux_hidden: Option<&Tensor>) -> Result<Option<Tensor>, GenerateError> {
        match aux_hidden {
            Some(aux) if self.k() > 0 => Ok(Some(self.proposer.project(aux)?)),
            _ => Ok(None),
        }
    }

    /// Gives the drafter each sequence's new target states `states` (the captured rows of the
    /// step's forward, projected by `project`, `rows[i].captured` being sequence i's) and sets
    /// `k` new drafts on every sequence that chose a token.
    pub fn run(
        &mut self,
        work: &mut [(&mut Sequence, Work)],
        states: Option<&Tensor>,
        rows: &[SequenceRows],
        committed: &[Committed],
        k: usize,
    ) -> Result<(), GenerateError> {
        let mut inputs = Vec::new();
        // The round's target states: the step's captured rows, where most sequences' are, and
        // after them the backlogs of sequences that catch the drafter up.
        let mut backlogs = Vec::new();
        let mut rows_so_far = states.map(|s| s.dim(0)).transpose()?.unwrap_or(0);
        for (index, (seq, _)) in work.iter_mut().enumerate() {
            let finished = seq.finish.is_some();
            if !self.drafts_for(seq) || finished && !self.complete_finished {
                continue;
            }
            let projected = states
                .ok_or_else(|| GenerateError::Config("the target returned no hidden states for the drafter".into()))?;
            let c = committed[index];
            let start = c.start;
            // Slot p holds the token after position p. A sequence that finished inside a
            // verification window has rows past its last token: they have no slot.
            let slots = c.rows.min((seq.token_ids.len() - 1).saturating_sub(start));
            let captured = rows[index].captured.start;
            let hidden = projected.narrow(0, captured, slots)?;
            let mut backlog = seq.drafter_backlog.take().unwrap_or(DrafterBacklog {
                start,
                hidden: Vec::new(),
            });
            backlog.hidden.push(hidden);
            if k == 0 && !finished {
                seq.drafter_backlog = Some(backlog);
                continue;
            }
            let end = start + slots;
            if end == backlog.start {
                continue;
            }
            let states = match backlog.hidden.as_slice() {
                [_] => captured..captured + slots,
                pieces => {
                    let caught_up = Tensor::cat(pieces, 0)?;
                    let first = rows_so_far;
                    rows_so_far += caught_up.dim(0)?;
                    backlogs.push(caught_up);
                    first..rows_so_far
                }
            };
            inputs.push(DraftInput {
                index,
                start: backlog.start,
                tokens: seq.token_ids[backlog.start + 1..=end].to_vec(),
                states,
                draft: c.sampled && !finished,
            });
        }
        let Some(projected) = states.filter(|_| !inputs.is_empty()) else {
            return Ok(());
        };
        let states = match backlogs.is_empty() {
            true => projected.clone(),
            false => Tensor::cat(&[std::slice::from_ref(projected), &backlogs].concat(), 0)?,
        };
        let requests: Vec<DraftRequest> = inputs
            .iter()
            .map(|p| DraftRequest {
                tokens: &p.tokens,
                start: p.start,
                states: p.states.clone(),
                block_table: &work[p.index].0.block_table,
                draft: p.draft,
            })
            .collect();
        // At k = 0 only finishing sequences run, drafting nothing.
        let drafts = self.proposer.propose(&states, &requests, k.max(1))?;
        for (input, d) in inputs.iter().zip(drafts) {
            let seq = &mut work[input.index].0;
            seq.num_drafted = input.start + input.tokens.len();
            if input.draft {
                seq.drafts_on_device = d;
            }
        }
        Ok(())
    }
}

/// Copies to the host the drafts that the step's verification windows took on the device,
/// once the target's forward is issued: the copy waits for the forward, which verification
/// waits for anyway, and not for the drafter before the forward is issued.
pub fn read_drafts(work: &mut [(&mut Sequence, Work)]) -> Result<(), GenerateError> {
    let on_device: Vec<&DeviceIds> = work
        .iter()
        .filter_map(|(seq, _)| seq.drafts_on_device.as_ref())
        .collect();
    if on_device.is_empty() {
        return Ok(());
    }
    let mut read = DeviceIds::to_host(&on_device)?.into_iter();
    for (seq, _) in work.iter_mut() {
        if seq.drafts_on_device.take().is_some() {
            seq.drafts = read.next().expect("drafts read for each sequence that has them");
        }
    }
    Ok(())
}

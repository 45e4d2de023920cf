//! The drafting round of a step: every drafting sequence hands the drafter the target states
//! of its newly committed tokens, and one proposer call drafts for all of them.
//!
//! With k = 0 (speculation suspended) the drafter does not run: each sequence keeps the states
//! the drafter has not read as a backlog, and the next step that drafts catches the drafter up
//! on them in the same pass.

use crate::error::GenerateError;
use crate::proposer::{DraftRequest, Proposer};
use crate::scheduler::Work;
use crate::sequence::{DrafterBacklog, Sequence};
use crate::verification::Committed;
use candle_core::Tensor;
use peagle_models::SequenceRows;

pub struct Drafting {
    proposer: Box<dyn Proposer>,
}

/// A drafter input for one scheduled sequence.
struct DraftInput {
    index: usize,
    start: usize,
    tokens: Vec<u32>,
    hidden: Tensor,
    draft: bool,
}

impl Drafting {
    pub fn new(proposer: Box<dyn Proposer>) -> Self {
        Self { proposer }
    }

    /// Most drafts per step (0 without a drafter).
    pub fn k(&self) -> usize {
        self.proposer.k()
    }

    /// Whether `seq` runs through the drafter at all (and so needs the target's states).
    pub fn drafts_for(&self, seq: &Sequence) -> bool {
        self.k() > 0 && seq.speculate
    }

    /// Gives the drafter each sequence's new target states `aux_hidden` (the captured rows of
    /// the step's forward, `rows[i].captured` being sequence i's) and sets `k` new drafts on
    /// every sequence that chose a token.
    pub fn run(
        &mut self,
        work: &mut [(&mut Sequence, Work)],
        aux_hidden: Option<&Tensor>,
        rows: &[SequenceRows],
        committed: &[Committed],
        k: usize,
    ) -> Result<(), GenerateError> {
        let mut inputs = Vec::new();
        for (index, (seq, _)) in work.iter_mut().enumerate() {
            if !self.drafts_for(seq) || seq.finish.is_some() {
                continue;
            }
            let aux = aux_hidden
                .ok_or_else(|| GenerateError::Config("the target returned no hidden states for the drafter".into()))?;
            let c = committed[index];
            let start = c.start;
            let hidden = aux.narrow(0, rows[index].captured.start, c.rows)?;
            let mut backlog = seq.drafter_backlog.take().unwrap_or(DrafterBacklog {
                start,
                hidden: Vec::new(),
            });
            backlog.hidden.push(hidden);
            if k == 0 {
                seq.drafter_backlog = Some(backlog);
                continue;
            }
            // Slot p holds the token after position p; all of them are committed by now.
            let end = start + c.rows;
            inputs.push(DraftInput {
                index,
                start: backlog.start,
                tokens: seq.token_ids[backlog.start + 1..=end].to_vec(),
                hidden: Tensor::cat(&backlog.hidden, 0)?,
                draft: c.sampled,
            });
        }
        if inputs.is_empty() {
            return Ok(());
        }
        let requests: Vec<DraftRequest> = inputs
            .iter()
            .map(|p| DraftRequest {
                tokens: &p.tokens,
                start: p.start,
                hidden: p.hidden.clone(),
                block_table: &work[p.index].0.block_table,
                draft: p.draft,
            })
            .collect();
        let drafts = self.proposer.propose(&requests, k)?;
        for (input, d) in inputs.iter().zip(drafts) {
            let seq = &mut work[input.index].0;
            seq.num_drafted = input.start + input.tokens.len();
            if input.draft {
                seq.drafts = d;
            }
        }
        Ok(())
    }
}

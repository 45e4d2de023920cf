//! Draft proposers: from each sequence's newly committed tokens and the target's hidden
//! states for them, propose the next K tokens (docs/ARCHITECTURE.md, "The drafter input layout").
//!
//! A request's slots pair token p+1 with the target state of position p: after a verification
//! that accepted `d1..da` and produced `t`, the slots are `[d1..da, t]` at positions `P..P+a`
//! (P = the window's first position) with the states of `[b, d1..da]`.

mod drafter_passes;
mod eagle3;
mod none;
mod peagle;

pub use drafter_passes::DrafterPasses;
pub use eagle3::Eagle3Proposer;
pub use none::NoProposer;
pub use peagle::PEagleProposer;

use candle_core::{Result, Tensor};
use peagle_kernels::argmax_rows;
use peagle_models::{BatchBuilder, DraftOutput, Drafter, PassHidden, Rows, SequenceRows};

pub struct DraftRequest<'a> {
    /// Slot tokens: the token after each position `start..start + tokens.len()`.
    pub tokens: &'a [u32],
    pub start: usize,
    /// Target states of those positions, [tokens.len(), aux layers * target hidden].
    pub hidden: Tensor,
    pub block_table: &'a [u32],
    /// False for a prefill chunk that is not the prompt's last: only the drafter cache is filled.
    pub draft: bool,
}

pub trait Proposer: Send {
    /// Most tokens proposed per step.
    fn k(&self) -> usize;

    /// Target layers whose inputs the drafter reads.
    fn aux_layer_ids(&self) -> &[usize];

    /// Positions past a request's last slot that a pass writes to the drafter cache, so the
    /// block table can be grown before the step.
    fn lookahead(&self) -> usize {
        self.k().saturating_sub(1)
    }

    /// `k` (at most `self.k()`) drafts, as target ids, for each request; none where `draft`
    /// is false.
    fn propose(&mut self, requests: &[DraftRequest], k: usize) -> Result<Vec<Vec<u32>>>;

    /// Captures the CUDA graphs of the drafter's passes, where it runs them by graphs; says
    /// how many (`DrafterGraphs::capture_at_startup`).
    fn capture_graphs(&mut self) -> Result<usize> {
        Ok(0)
    }
}

/// The first drafter pass over every request, with `mask_slots` mask tokens after each
/// drafting request's slots; `mask` is the mask token and its hidden input, already through
/// `fc`. Returns the output and where each request's logits rows landed.
fn first_pass(
    passes: &mut DrafterPasses,
    requests: &[DraftRequest],
    mask: Option<(u32, &Tensor)>,
    mask_slots: usize,
) -> Result<(DraftOutput, Vec<SequenceRows>)> {
    let mut batch = BatchBuilder::new(passes.block_size());
    let mut placed = Vec::with_capacity(requests.len());
    let target_rows: usize = requests.iter().map(|r| r.tokens.len()).sum();
    // Row of [fc(target states); mask state] that each slot reads; the mask state is last.
    let mut sources: Vec<u32> = Vec::with_capacity(target_rows + requests.len() * mask_slots);
    let mut next_target_row = 0;
    for r in requests {
        let extra = if r.draft && mask.is_some() { mask_slots } else { 0 };
        let mut tokens = r.tokens.to_vec();
        sources.extend(next_target_row as u32..(next_target_row + r.tokens.len()) as u32);
        next_target_row += r.tokens.len();
        if let Some((token, _)) = mask.filter(|_| extra > 0) {
            tokens.extend(std::iter::repeat_n(token, extra));
            sources.extend(std::iter::repeat_n(target_rows as u32, extra));
        }
        let logits = if r.draft { Rows::Tail(1 + extra) } else { Rows::None };
        placed.push(batch.add(&tokens, r.start, r.block_table, logits, Rows::None)?);
    }
    let aux: Vec<&Tensor> = requests.iter().map(|r| &r.hidden).collect();
    let hidden = passes.drafter().project_target(&Tensor::cat(&aux, 0)?)?;
    let out = match mask.filter(|_| sources.len() > target_rows) {
        Some((_, state)) => {
            let table = Tensor::cat(&[&hidden, state], 0)?;
            passes.run(&batch.build(), PassHidden::picked(&table, &sources))?
        }
        None => passes.run(&batch.build(), PassHidden::rows(&hidden))?,
    };
    Ok((out, placed))
}

/// Greedy draft ids (as target ids) of the given logits rows: each row's argmax, found where
/// the rows are, so that a GPU sends the host one id a row rather than the rows.
fn greedy_drafts(drafter: &Drafter, logits: &Tensor) -> Result<Vec<u32>> {
    let rows: Vec<u32> = (0..logits.dim(0)? as u32).collect();
    Ok(argmax_rows(logits, &rows)?
        .into_iter()
        .map(|id| drafter.to_target_id(id as usize))
        .collect())
}

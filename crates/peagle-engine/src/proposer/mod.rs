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

use candle_core::{bail, Result, Tensor};
use peagle_models::{BatchBuilder, DeviceIds, GreedyDrafts, PassHidden, Rows, SequenceRows};
use std::ops::Range;

pub struct DraftRequest<'a> {
    /// Slot tokens: the token after each position `start..start + tokens.len()`.
    pub tokens: &'a [u32],
    pub start: usize,
    /// The rows of the round's target states (`Proposer::propose`'s `states`) that hold those
    /// positions', one a token.
    pub states: Range<usize>,
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

    /// The drafter's hidden input from captured target states `aux` [rows, aux layers *
    /// target hidden]: [rows, drafter hidden], through the drafter's `fc`. The engine projects
    /// a step's captured rows as soon as its forward is issued, in one launch, and keeps
    /// backlogs projected.
    fn project(&self, aux: &Tensor) -> Result<Tensor>;

    /// `k` (at most `self.k()`) drafts, as target ids, for each request; None where `draft`
    /// is false. The drafts stay on the device: the next verification window takes them
    /// there, and the host reads them while the target runs. `states` [rows, drafter hidden]
    /// holds the requests' projected target states (`project`), each request's at its rows:
    /// one tensor for the round, so that the drafter gathers its pass's rows from it rather
    /// than copying each request's rows together first.
    fn propose(&mut self, states: &Tensor, requests: &[DraftRequest], k: usize) -> Result<Vec<Option<DeviceIds>>>;

    /// Captures the CUDA graphs of the drafter's passes, where it runs them by graphs; says
    /// how many (`DrafterGraphs::capture_at_startup`).
    fn capture_graphs(&mut self) -> Result<usize> {
        Ok(0)
    }
}

/// The first drafter pass over every request, with `mask_slots` mask tokens after each
/// drafting request's slots, over the projected target states `states`; `mask` is the mask
/// token and its hidden input, already through `fc`. Returns its greedy drafts and where each
/// request's logits rows landed.
fn first_pass(
    passes: &mut DrafterPasses,
    states: &Tensor,
    requests: &[DraftRequest],
    mask: Option<(u32, &Tensor)>,
    mask_slots: usize,
) -> Result<(GreedyDrafts, Vec<SequenceRows>)> {
    let mut batch = BatchBuilder::new(passes.block_size());
    let mut placed = Vec::with_capacity(requests.len());
    // Row of the projected states that each slot reads, or past them the mask state.
    let past = states.dim(0)? as u32;
    let mut sources: Vec<u32> = Vec::new();
    for r in requests {
        if r.states.len() != r.tokens.len() || r.states.end > past as usize {
            bail!(
                "a request of {} slots at rows {:?} of {past} target states",
                r.tokens.len(),
                r.states
            );
        }
        let extra = if r.draft && mask.is_some() { mask_slots } else { 0 };
        let mut tokens = r.tokens.to_vec();
        sources.extend(r.states.start as u32..r.states.end as u32);
        if let Some((token, _)) = mask.filter(|_| extra > 0) {
            tokens.extend(std::iter::repeat_n(token, extra));
            sources.extend(std::iter::repeat_n(past, extra));
        }
        let logits = if r.draft { Rows::Tail(1 + extra) } else { Rows::None };
        placed.push(batch.add(&tokens, r.start, r.block_table, logits, Rows::None)?);
    }
    let in_order = sources.len() == past as usize && sources.iter().zip(0..).all(|(s, i)| *s == i);
    let pass_hidden = match in_order {
        true => PassHidden::rows(states),
        false => PassHidden::picked(states, mask.map(|(_, state)| state), &sources),
    };
    let out = passes.run(&batch.build(), pass_hidden)?;
    Ok((out, placed))
}

//! The drafter with its KV cache, as the proposers run it: each pass by a CUDA graph where one
//! fits the pass's shape (`DrafterGraphs`), else as it is, to the same bits.

use candle_core::{Result, Tensor};
use peagle_models::{DraftHidden, Drafter, DrafterGraphs, ForwardBatch, GreedyDrafts, KvCache, PassHidden};

/// The drafter with its KV cache, running each pass by a CUDA graph where it has one for the
/// pass's shape.
pub struct DrafterPasses {
    drafter: Drafter,
    kv: KvCache,
    graphs: Option<DrafterGraphs>,
}

impl DrafterPasses {
    pub fn new(drafter: Drafter, kv: KvCache, graphs: Option<DrafterGraphs>) -> Self {
        Self { drafter, kv, graphs }
    }

    pub fn drafter(&self) -> &Drafter {
        &self.drafter
    }

    /// The drafter's KV cache, which the passes write.
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    pub fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    /// The greedy drafts of a pass over `batch` with the hidden input `hidden`, at the
    /// drafter's width: by a graph where the pass's shape has one, else as it is. A graph gives
    /// the same bits.
    pub(super) fn run(&mut self, batch: &ForwardBatch, hidden: PassHidden) -> Result<GreedyDrafts> {
        pass(&self.drafter, &self.kv, self.graphs.as_mut(), batch, hidden)
    }

    /// The next pass of autoregressive drafting after `last`, as `run`: `batch` has one row for
    /// each of `last`'s logit rows, in order, whose tokens are placeholders for `last`'s drafts,
    /// which the pass reads on the device and writes into `drafts` (u32 [logit rows]) as
    /// target ids.
    pub(super) fn run_after(
        &mut self,
        batch: &ForwardBatch,
        last: &GreedyDrafts,
        drafts: &Tensor,
    ) -> Result<GreedyDrafts> {
        let input = last.chained(&self.drafter, drafts);
        pass(&self.drafter, &self.kv, self.graphs.as_mut(), batch, input)
    }

    pub(super) fn capture_graphs(&mut self) -> Result<usize> {
        match &mut self.graphs {
            Some(graphs) => graphs.capture_at_startup(&self.drafter, &self.kv),
            None => Ok(0),
        }
    }
}

/// `DrafterPasses::run` over the passes' parts.
fn pass(
    drafter: &Drafter,
    kv: &KvCache,
    graphs: Option<&mut DrafterGraphs>,
    batch: &ForwardBatch,
    hidden: PassHidden,
) -> Result<GreedyDrafts> {
    if let Some(graphs) = graphs {
        match graphs.forward(drafter, batch, hidden, kv) {
            Ok(Some(out)) => return Ok(out),
            Ok(None) => {}
            Err(e) => tracing::warn!("this drafter pass's shape runs without a CUDA graph: {e}"),
        }
    }
    let inputs = drafter.inputs(batch, &[])?;
    let hidden = DraftHidden::Projected(hidden.feed_own_rows(&inputs.ids)?);
    let out = drafter.forward_inputs(&inputs, &hidden, kv)?;
    drafter.greedy(out)
}

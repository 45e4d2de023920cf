//! The drafter with its KV cache, as the proposers run it: each pass by a CUDA graph where one
//! fits the pass's shape (`DrafterGraphs`), else as it is, to the same bits.

use candle_core::Result;
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

    pub fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    /// The greedy drafts of a pass over `batch` with the hidden input `hidden`, at the
    /// drafter's width: by a graph where the pass's shape has one, else as it is. A graph gives
    /// the same bits.
    pub(super) fn run(&mut self, batch: &ForwardBatch, hidden: PassHidden) -> Result<GreedyDrafts> {
        if let Some(graphs) = &mut self.graphs {
            match graphs.forward(&self.drafter, batch, hidden, &self.kv) {
                Ok(Some(out)) => return Ok(out),
                Ok(None) => {}
                Err(e) => tracing::warn!("this drafter pass's shape runs without a CUDA graph: {e}"),
            }
        }
        let out = self
            .drafter
            .forward(batch, &DraftHidden::Projected(hidden.gather()?), &self.kv)?;
        self.drafter.greedy(out)
    }

    pub(super) fn capture_graphs(&mut self) -> Result<usize> {
        match &mut self.graphs {
            Some(graphs) => graphs.capture_at_startup(&self.drafter, &self.kv),
            None => Ok(0),
        }
    }
}

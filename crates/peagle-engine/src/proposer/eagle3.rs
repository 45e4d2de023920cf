use super::{first_pass, target_ids, DraftRequest, DrafterPasses, Proposer};
use candle_core::{Result, Tensor};
use peagle_models::{BatchBuilder, Rows};

/// EAGLE-3: K drafter passes. The first covers the request's slots and gives draft 1; each
/// later pass feeds the previous draft with the drafter's own output as the hidden input.
pub struct Eagle3Proposer {
    passes: DrafterPasses,
    k: usize,
}

impl Eagle3Proposer {
    pub fn new(passes: DrafterPasses, k: usize) -> Self {
        Self { passes, k }
    }
}

impl Proposer for Eagle3Proposer {
    fn k(&self) -> usize {
        self.k
    }

    fn aux_layer_ids(&self) -> &[usize] {
        self.passes.drafter().aux_layer_ids()
    }

    fn propose(&mut self, states: &Tensor, requests: &[DraftRequest], k: usize) -> Result<Vec<Vec<u32>>> {
        let (out, _) = first_pass(&mut self.passes, states, requests, None, 0)?;
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); requests.len()];
        let drafting: Vec<usize> = (0..requests.len()).filter(|i| requests[*i].draft).collect();
        if drafting.is_empty() {
            return Ok(drafts);
        }
        // The drafts as target ids, which the next pass reads, and the pass they came from.
        let mut last = target_ids(self.passes.drafter(), &out.ids);
        let mut pass = out;
        for (i, d) in drafting.iter().zip(&last) {
            drafts[*i].push(*d);
        }
        for step in 1..k.min(self.k) {
            let mut batch = BatchBuilder::new(self.passes.block_size());
            for (j, i) in drafting.iter().enumerate() {
                let r = &requests[*i];
                let pos = r.start + r.tokens.len() - 1 + step;
                batch.add(&last[j..j + 1], pos, r.block_table, Rows::Tail(1), Rows::None)?;
            }
            pass = self.passes.run(&batch.build(), pass.hidden())?;
            last = target_ids(self.passes.drafter(), &pass.ids);
            for (i, d) in drafting.iter().zip(&last) {
                drafts[*i].push(*d);
            }
        }
        Ok(drafts)
    }

    fn capture_graphs(&mut self) -> Result<usize> {
        self.passes.capture_graphs()
    }
}

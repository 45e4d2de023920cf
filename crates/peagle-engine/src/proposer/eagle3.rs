use super::{first_pass, target_ids, DraftRequest, DrafterPasses, Proposer};
use candle_core::{DType, Result, Tensor};
use peagle_models::{BatchBuilder, Rows};

/// EAGLE-3: K drafter passes. The first covers the request's slots and gives draft 1; each
/// later pass feeds the previous draft with the drafter's own output as the hidden input, both
/// on the device (`DrafterPasses::run_after`), as vLLM's EAGLE proposer chains them.
pub struct Eagle3Proposer {
    passes: DrafterPasses,
    k: usize,
    /// The last step's u32 [passes - 1, drafting sequences]: pass s (s >= 1) writes the drafts
    /// of pass s - 1, which it reads as its tokens, into row s - 1. Kept for the next step of
    /// that shape: the host has read it.
    chained: Option<Tensor>,
}

impl Eagle3Proposer {
    pub fn new(passes: DrafterPasses, k: usize) -> Self {
        Self {
            passes,
            k,
            chained: None,
        }
    }

    /// A [rows, sequences] u32 tensor for the passes to write the drafts they read into: the
    /// last step's where it has that shape.
    fn chained(&mut self, rows: usize, sequences: usize) -> Result<Tensor> {
        if let Some(kept) = self.chained.as_ref().filter(|t| t.dims() == [rows, sequences]) {
            return Ok(kept.clone());
        }
        let fresh = Tensor::zeros((rows, sequences), DType::U32, self.passes.drafter().device())?;
        Ok(self.chained.insert(fresh).clone())
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
        let (first, _) = first_pass(&mut self.passes, states, requests, None, 0)?;
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); requests.len()];
        let drafting: Vec<usize> = (0..requests.len()).filter(|i| requests[*i].draft).collect();
        if drafting.is_empty() {
            return Ok(drafts);
        }
        // Each later pass reads the last one's drafts where they are, and writes them as
        // target ids into its row of `chained`; the last pass's own are read from it. The host
        // waits for the drafts once, after the last pass.
        let passes = k.min(self.k).max(1);
        let mut pass = first;
        let mut earlier: Vec<Vec<u32>> = Vec::new();
        if passes > 1 {
            let chained = self.chained(passes - 1, drafting.len())?;
            for step in 1..passes {
                let mut batch = BatchBuilder::new(self.passes.block_size());
                for i in &drafting {
                    let r = &requests[*i];
                    let pos = r.start + r.tokens.len() - 1 + step;
                    // A placeholder token: the pass reads the last pass's draft instead.
                    batch.add(&[0], pos, r.block_table, Rows::Tail(1), Rows::None)?;
                }
                pass = self.passes.run_after(&batch.build(), &pass, &chained.get(step - 1)?)?;
            }
            earlier = chained.to_vec2()?;
        }
        let last = target_ids(self.passes.drafter(), &pass.ids()?);
        for (j, i) in drafting.iter().enumerate() {
            drafts[*i] = earlier.iter().map(|row| row[j]).chain([last[j]]).collect();
        }
        Ok(drafts)
    }

    fn capture_graphs(&mut self) -> Result<usize> {
        self.passes.capture_graphs()
    }
}

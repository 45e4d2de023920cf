use super::{first_pass, DraftRequest, DrafterPasses, Proposer};
use candle_core::{Result, Tensor};
use peagle_models::{BatchBuilder, DeviceIds, Rows};

/// EAGLE-3: K drafter passes. The first covers the request's slots and gives draft 1; each
/// later pass feeds the previous draft with the drafter's own output as the hidden input, both
/// on the device (`DrafterPasses::run_after`), as vLLM's EAGLE proposer chains them.
pub struct Eagle3Proposer {
    passes: DrafterPasses,
    k: usize,
}

impl Eagle3Proposer {
    pub fn new(passes: DrafterPasses, k: usize) -> Self {
        Self { passes, k }
    }

    /// The drafter and its cache, as the passes left them.
    pub fn passes(&self) -> &DrafterPasses {
        &self.passes
    }
}

impl Proposer for Eagle3Proposer {
    fn k(&self) -> usize {
        self.k
    }

    fn aux_layer_ids(&self) -> &[usize] {
        self.passes.drafter().aux_layer_ids()
    }

    fn project(&self, aux: &Tensor) -> Result<Tensor> {
        self.passes.drafter().project_target(aux)
    }

    fn propose(&mut self, states: &Tensor, requests: &[DraftRequest], k: usize) -> Result<Vec<Option<DeviceIds>>> {
        let (first, _) = first_pass(&mut self.passes, states, requests, None, 0)?;
        let drafting: Vec<usize> = (0..requests.len()).filter(|i| requests[*i].draft).collect();
        let mut drafts = vec![None; requests.len()];
        if drafting.is_empty() {
            return Ok(drafts);
        }
        // The step's drafts as target ids, pass by pass: pass s's for the drafting requests in
        // order at s * n. Each later pass reads the last one's drafts where they are and writes
        // them here; the last pass's own are mapped here after it, so every element is written
        // before anything reads it. A new tensor each step: a sequence that sits out the next
        // step keeps its drafts in it until it is verified.
        let (passes, n) = (k.min(self.k).max(1), drafting.len());
        let all = peagle_kernels::ids_to_write(passes * n, self.passes.drafter().device())?;
        let mut pass = first;
        for step in 1..passes {
            let mut batch = BatchBuilder::new(self.passes.block_size());
            for i in &drafting {
                let r = &requests[*i];
                let pos = r.start + r.tokens.len() - 1 + step;
                // A placeholder token: the pass reads the last pass's draft instead.
                batch.add(&[0], pos, r.block_table, Rows::Tail(1), Rows::None)?;
            }
            pass = self
                .passes
                .run_after(&batch.build(), &pass, &all.narrow(0, (step - 1) * n, n)?)?;
        }
        pass.target_ids(self.passes.drafter(), Some(&all.narrow(0, (passes - 1) * n, n)?))?;
        for (j, i) in drafting.into_iter().enumerate() {
            drafts[i] = Some(DeviceIds {
                ids: all.clone(),
                picks: (0..passes).map(|s| (s * n + j) as u32).collect(),
            });
        }
        Ok(drafts)
    }

    fn capture_graphs(&mut self) -> Result<usize> {
        self.passes.capture_graphs()
    }
}

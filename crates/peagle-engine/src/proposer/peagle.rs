use super::{first_pass, DraftRequest, DrafterPasses, Proposer};
use candle_core::{Result, Tensor};
use peagle_models::{DeviceIds, LoadError};

/// P-EAGLE: all K drafts from one drafter pass. After each request's slots come K-1 mask
/// slots (mask token, shared hidden state `fc(mask_hidden)`); the logits of the last real slot
/// and of the mask slots are the K drafts. Mask-slot cache rows are overwritten next step.
pub struct PEagleProposer {
    passes: DrafterPasses,
    k: usize,
    mask_token: u32,
    /// `fc(mask_hidden)`, [1, drafter hidden]: the same for every mask slot, so computed once.
    mask_state: Tensor,
}

impl PEagleProposer {
    pub fn new(passes: DrafterPasses, k: usize) -> std::result::Result<Self, LoadError> {
        let drafter = passes.drafter();
        let (mask_token, mask_hidden) = drafter.parallel_inputs()?;
        let mask_state = drafter
            .project_target(mask_hidden)
            .map_err(|source| LoadError::Candle {
                context: "projecting mask_hidden through fc".into(),
                source,
            })?;
        Ok(Self {
            passes,
            k,
            mask_token,
            mask_state,
        })
    }
}

impl Proposer for PEagleProposer {
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
        let mask = Some((self.mask_token, &self.mask_state));
        let masks = k.min(self.k).saturating_sub(1);
        let (out, placed) = first_pass(&mut self.passes, states, requests, mask, masks)?;
        if !requests.iter().any(|r| r.draft) {
            return Ok(vec![None; requests.len()]);
        }
        let ids = out.target_ids(self.passes.drafter(), None)?;
        let drafts = placed.iter().zip(requests).map(|(p, r)| {
            r.draft.then(|| DeviceIds {
                ids: ids.clone(),
                picks: (p.logits.start as u32..p.logits.end as u32).collect(),
            })
        });
        Ok(drafts.collect())
    }

    fn capture_graphs(&mut self) -> Result<usize> {
        self.passes.capture_graphs()
    }
}

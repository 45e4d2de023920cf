use super::{DraftRequest, Proposer};
use candle_core::{bail, Result, Tensor};
use peagle_models::DeviceIds;

/// Plain decoding: no drafts, every step verifies a window of one token.
pub struct NoProposer;

impl Proposer for NoProposer {
    fn k(&self) -> usize {
        0
    }

    fn aux_layer_ids(&self) -> &[usize] {
        &[]
    }

    fn project(&self, _aux: &Tensor) -> Result<Tensor> {
        bail!("plain decoding has no drafter to project target states for")
    }

    fn propose(&mut self, _states: &Tensor, requests: &[DraftRequest], _k: usize) -> Result<Vec<Option<DeviceIds>>> {
        Ok(vec![None; requests.len()])
    }
}

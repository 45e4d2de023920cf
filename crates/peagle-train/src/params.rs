//! The trainable weights of a drafter, as candle variables under their checkpoint names.

use crate::error::TrainError;
use candle_core::{Tensor, Var};
use peagle_models::{Checkpoint, Drafter, DrafterConfig, LoadOptions, TargetModel};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

pub struct Params {
    pub names: Vec<String>,
    pub vars: Vec<Var>,
}

impl Params {
    pub fn new(weights: BTreeMap<String, Tensor>) -> Result<Self, TrainError> {
        let mut names = Vec::with_capacity(weights.len());
        let mut vars = Vec::with_capacity(weights.len());
        for (name, t) in weights {
            vars.push(Var::from_tensor(&t)?);
            names.push(name);
        }
        Ok(Self { names, vars })
    }

    /// A drafter whose weights are these variables: its passes track gradients.
    pub fn drafter(&self, config: &DrafterConfig, target: &dyn TargetModel) -> Result<Drafter, TrainError> {
        let tensors = self.tensors(|v| v.as_tensor().clone());
        self.build(config, target, tensors)
    }

    /// A drafter over a copy of the current weights, for evaluation on the fast kernels.
    pub fn frozen_drafter(&self, config: &DrafterConfig, target: &dyn TargetModel) -> Result<Drafter, TrainError> {
        let tensors = self.tensors(|v| v.as_tensor().detach());
        self.build(config, target, tensors)
    }

    /// The current values, detached.
    pub fn snapshot(&self) -> BTreeMap<String, Tensor> {
        self.names
            .iter()
            .cloned()
            .zip(self.vars.iter().map(|v| v.as_tensor().detach()))
            .collect()
    }

    pub fn num_elements(&self) -> usize {
        self.vars.iter().map(|v| v.elem_count()).sum()
    }

    fn tensors(&self, f: impl Fn(&Var) -> Tensor) -> HashMap<String, Tensor> {
        self.names.iter().cloned().zip(self.vars.iter().map(f)).collect()
    }

    fn build(
        &self,
        config: &DrafterConfig,
        target: &dyn TargetModel,
        tensors: HashMap<String, Tensor>,
    ) -> Result<Drafter, TrainError> {
        let options = LoadOptions {
            device: target.device().clone(),
            ..LoadOptions::default()
        };
        let ckpt = Checkpoint::from_tensors(Path::new("<drafter in training>"), tensors, options);
        Ok(Drafter::from_checkpoint(config.clone(), &ckpt, target)?)
    }
}

//! `fit --init-from DIR`: a new run that starts from a drafter `fit` exported, so training can
//! go on where an earlier run stopped without its checkpoint (weights and optimizer moments in
//! f32: six times a bf16 export to carry between machines). The run keeps the drafter's draft
//! vocabulary, mask token and residual layout; its optimizer and learning-rate schedule start afresh.

use crate::blueprint::Algo;
use crate::error::TrainError;
use crate::export::{D2T, T2D};
use crate::files::read_json;
use candle_core::{DType, Device, Tensor};
use peagle_models::{Checkpoint, DrafterConfig, LoadOptions};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// An exported drafter, opened for training.
pub struct Exported {
    dir: PathBuf,
    checkpoint: Checkpoint,
    /// Target ids of the draft vocabulary, in draft id order.
    pub draft_vocab: Vec<u32>,
    pub mask_token_id: Option<u32>,
    /// The residual layout the weights were trained with.
    pub norm_before_residual: bool,
}

impl Exported {
    /// Opens `dir`'s config.json and model.safetensors, checking the drafter is an `algo` one
    /// for a target of `target_vocab_size` tokens that reads the target layers the data holds,
    /// `aux_layer_ids` (where its config names them; without, it serves vLLM's default ones).
    pub fn open(
        dir: &Path,
        algo: Algo,
        target_vocab_size: usize,
        aux_layer_ids: &[usize],
        device: &Device,
    ) -> Result<Self, TrainError> {
        let config_path = dir.join("config.json");
        let config: serde_json::Value = read_json(&config_path)?;
        let kind = config["speculators_model_type"].as_str().unwrap_or("unknown");
        if kind != algo.name() {
            return Err(TrainError::Invalid(format!(
                "{} holds a drafter of kind {kind}, but this run trains {}",
                dir.display(),
                algo.name()
            )));
        }
        // Read as the server reads it, so that training continues the drafter it serves.
        let drafter = DrafterConfig::from_value(&config, &config_path)?;
        if let Some(ids) = drafter.aux_layer_ids.as_deref().filter(|ids| *ids != aux_layer_ids) {
            return Err(TrainError::Invalid(format!(
                "{} reads the target's layers {ids:?}, but the data holds layers {aux_layer_ids:?}",
                dir.display()
            )));
        }
        let options = LoadOptions {
            device: device.clone(),
            dtype: DType::F32,
        };
        let checkpoint = Checkpoint::open(dir, options)?;
        let t2d = checkpoint.shape_of(T2D)?;
        if t2d != [target_vocab_size] {
            return Err(TrainError::Invalid(format!(
                "{} drafts for a target of {t2d:?} tokens, the data's target has {target_vocab_size}",
                dir.display(),
            )));
        }
        let path = dir.join("model.safetensors");
        let d2t = checkpoint.int64(D2T, &checkpoint.shape_of(D2T)?)?;
        let draft_vocab = d2t
            .flatten_all()?
            .to_vec1::<i64>()?
            .iter()
            .enumerate()
            .map(|(i, offset)| u32::try_from(i as i64 + offset).ok())
            .map(|id| id.filter(|id| (*id as usize) < target_vocab_size))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| TrainError::data(&path, "d2t maps outside the target vocabulary"))?;
        let mask_token_id = config["mask_token_id"].as_u64().map(|id| id as u32);
        if algo == Algo::Peagle && mask_token_id.is_none() {
            return Err(TrainError::data(
                &dir.join("config.json"),
                "a P-EAGLE drafter without mask_token_id",
            ));
        }
        Ok(Self {
            dir: dir.to_owned(),
            checkpoint,
            draft_vocab,
            mask_token_id,
            norm_before_residual: drafter.norm_before_residual,
        })
    }

    /// The weights, f32, once the file holds exactly the names and shapes of `shapes` (the
    /// run's own drafter): a drafter of another shape cannot continue as this one.
    pub fn weights(&self, shapes: &BTreeMap<String, Vec<usize>>) -> Result<BTreeMap<String, Tensor>, TrainError> {
        let mismatch = |m: String| Err(TrainError::Invalid(format!("{}: {m}", self.dir.display())));
        let stored = self.checkpoint.names().filter(|n| ![D2T, T2D].contains(n));
        if let Some(extra) = stored.into_iter().find(|n| !shapes.contains_key(*n)) {
            return mismatch(format!(
                "{extra} is not a weight of this run's drafter (check its number of layers)"
            ));
        }
        let mut weights = BTreeMap::new();
        for (name, want) in shapes {
            if !self.checkpoint.contains(name) {
                return mismatch(format!("no {name} (check the drafter's number of layers)"));
            }
            let shape = self.checkpoint.shape_of(name)?;
            if shape != *want {
                return mismatch(format!("{name} is {shape:?}, this run's drafter needs {want:?}"));
            }
            weights.insert(name.clone(), self.checkpoint.vector(name, &shape)?);
        }
        Ok(weights)
    }
}

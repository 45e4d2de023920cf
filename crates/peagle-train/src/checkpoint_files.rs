//! The checkpoint a training run keeps in `<out>/checkpoint`, and `--resume` from it.
//!
//! The directory holds:
//! - `weights-<step>.safetensors`: the weights and their AdamW moments (`adam.m.<name>`,
//!   `adam.v.<name>`), named by the step they were saved at;
//! - `vocab.json`: the run's choices ([`RunChoices`]);
//! - `state.json`: the [`TrainState`], which names the weights by its step. It is written last
//!   and each file atomically, so an interrupt between the files leaves the previous checkpoint
//!   whole, never newer weights under an older state. Older weights are deleted after it.
//!
//! A resumed run must be the same run: `--resume` refuses a checkpoint of another algorithm or
//! of another drafter shape, and a fresh run refuses an `--out` that holds one.

use crate::blueprint::{Algo, DrafterBlueprint};
use crate::error::TrainError;
use crate::files::{read_json, write_atomically, write_json};
use crate::optimizer::AdamW;
use crate::params::Params;
use crate::train_state::TrainState;
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const CHECKPOINT: &str = "checkpoint";

/// The choices a resumed run must keep: the draft vocabulary and mask token drawn from the
/// data, and the residual layout (in `vocab.json`, named when it held the vocabulary alone).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunChoices {
    pub draft_vocab: Vec<u32>,
    pub mask_token_id: Option<u32>,
    /// Absent in checkpoints written before new drafters normed their residual, whose rule was
    /// "EAGLE-3 only".
    #[serde(default)]
    pub norm_before_residual: Option<bool>,
}

/// A run read back from its checkpoint.
pub struct Resumed {
    pub state: TrainState,
    pub choices: RunChoices,
}

/// Optimizer moments by weight name: first, then second.
pub type Moments = (BTreeMap<String, Tensor>, BTreeMap<String, Tensor>);

/// The run in `out` when `resume`, which must be one of `algo`; without `resume`, checks that
/// `out` holds no run a fresh one would overwrite.
pub fn resumed(out: &Path, resume: bool, algo: Algo) -> Result<Option<Resumed>, TrainError> {
    let dir = out.join(CHECKPOINT);
    let state_path = dir.join("state.json");
    if !resume {
        // A fresh run would overwrite the checkpoint (the earlier run's work), or a model: a
        // drafter exported by hand or downloaded, the target itself.
        let model = ["config.json", "model.safetensors"]
            .iter()
            .find(|f| out.join(f).exists());
        return match (state_path.exists(), model) {
            (true, _) => Err(TrainError::Invalid(format!(
                "{} already holds a training run: resume it, or choose another output directory",
                out.display()
            ))),
            (false, Some(file)) => Err(TrainError::Invalid(format!(
                "{} already holds a model ({file}): choose another output directory",
                out.display()
            ))),
            (false, None) => Ok(None),
        };
    }
    let state: TrainState = read_json(&state_path)?;
    let choices: RunChoices = read_json(&dir.join("vocab.json"))?;
    if state.algo != algo.name() {
        return Err(TrainError::Invalid(format!(
            "{} holds a {} run: resume it as {}",
            out.display(),
            state.algo,
            state.algo
        )));
    }
    Ok(Some(Resumed { state, choices }))
}

/// The weights saved at `step` in `out`, which must be the drafter `blueprint` describes, and their
/// optimizer moments, on `device`.
pub fn load_weights(
    out: &Path,
    step: usize,
    blueprint: &DrafterBlueprint,
    device: &Device,
) -> Result<(BTreeMap<String, Tensor>, Moments), TrainError> {
    let path = weights_path(out, step);
    let (weights, moments) = load_checkpoint(&path, device)?;
    check_shapes(&weights, &blueprint.weight_shapes()?, &path)?;
    Ok((weights, moments))
}

/// Puts saved moments back into a new optimizer, which continues after `step` updates.
pub fn restore_optimizer(optimizer: &mut AdamW, params: &Params, (m, v): Moments, step: usize) {
    optimizer.m = params.names.iter().map(|n| m[n].clone()).collect();
    optimizer.v = params.names.iter().map(|n| v[n].clone()).collect();
    optimizer.step = step;
}

/// Saves the checkpoint of `state` in `out`: the weights of `params` with the moments of
/// `optimizer`, the choices of `blueprint`, then the state.
pub fn save(
    out: &Path,
    state: &TrainState,
    params: &Params,
    optimizer: &AdamW,
    blueprint: &DrafterBlueprint,
) -> Result<(), TrainError> {
    let dir = out.join(CHECKPOINT);
    std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
    let mut tensors = std::collections::HashMap::new();
    for (i, name) in params.names.iter().enumerate() {
        tensors.insert(name.clone(), params.vars[i].as_tensor().detach());
        tensors.insert(format!("adam.m.{name}"), optimizer.m[i].clone());
        tensors.insert(format!("adam.v.{name}"), optimizer.v[i].clone());
    }
    let weights = weights_path(out, state.step);
    write_atomically(&weights, |partial| {
        candle_core::safetensors::save(&tensors, partial).map_err(|e| TrainError::io(&weights, e))
    })?;
    let choice = RunChoices {
        draft_vocab: blueprint.vocab.selected.clone(),
        mask_token_id: blueprint.mask_token_id,
        norm_before_residual: Some(blueprint.norm_before_residual),
    };
    // Compact: four thousand ids one per line would bury the file.
    let vocab = dir.join("vocab.json");
    let text = serde_json::to_string(&choice).map_err(|e| TrainError::io(&vocab, e))?;
    write_atomically(&vocab, |partial| {
        std::fs::write(partial, text).map_err(|e| TrainError::io(&vocab, e))
    })?;
    // Last: it names the weights just written, which make older ones obsolete.
    write_json(&dir.join("state.json"), state)?;
    remove_older_weights(&dir, state.step)
}

/// The checkpoint weights of `step`.
fn weights_file(step: usize) -> String {
    format!("weights-{step:08}.safetensors")
}

fn weights_path(out: &Path, step: usize) -> PathBuf {
    out.join(CHECKPOINT).join(weights_file(step))
}

/// Deletes the weights of checkpoints before `step`, once a newer state names newer weights.
fn remove_older_weights(dir: &Path, step: usize) -> Result<(), TrainError> {
    let keep = weights_file(step);
    for entry in std::fs::read_dir(dir).map_err(|e| TrainError::io(dir, e))? {
        let path = entry.map_err(|e| TrainError::io(dir, e))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("weights-") && name.ends_with(".safetensors") && name != keep {
            std::fs::remove_file(&path).map_err(|e| TrainError::io(&path, e))?;
        }
    }
    Ok(())
}

/// A resumed checkpoint must hold the drafter these flags describe.
fn check_shapes(
    params: &BTreeMap<String, Tensor>,
    wanted: &BTreeMap<String, Vec<usize>>,
    path: &Path,
) -> Result<(), TrainError> {
    let differs = params.len() != wanted.len()
        || wanted
            .iter()
            .any(|(name, shape)| params.get(name).is_none_or(|t| t.dims() != shape.as_slice()));
    match differs {
        true => Err(TrainError::data(
            path,
            "holds a drafter of another shape than this run's (layers, draft vocabulary): \
             resume it with the run's own shape",
        )),
        false => Ok(()),
    }
}

/// The weights of a checkpoint, and its optimizer moments, on `device`.
fn load_checkpoint(path: &Path, device: &Device) -> Result<(BTreeMap<String, Tensor>, Moments), TrainError> {
    let tensors = candle_core::safetensors::load(path, device).map_err(|e| TrainError::io(path, e))?;
    let (mut weights, mut m, mut v) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for (name, t) in tensors {
        if let Some(n) = name.strip_prefix("adam.m.") {
            m.insert(n.to_owned(), t);
        } else if let Some(n) = name.strip_prefix("adam.v.") {
            v.insert(n.to_owned(), t);
        } else {
            weights.insert(name, t);
        }
    }
    if weights.keys().any(|n| !m.contains_key(n) || !v.contains_key(n)) {
        return Err(TrainError::data(path, "optimizer moments missing for some weights"));
    }
    Ok((weights, (m, v)))
}

//! Writes a trained drafter in the speculators format: `config.json` and `model.safetensors`
//! with the tensor names vLLM and peagle's own loader read, plus `d2t` (int64 offsets) and
//! `t2d` (bool), as speculators stores them.

use crate::blueprint::DrafterBlueprint;
use crate::error::TrainError;
use crate::files::write_json;
use candle_core::{DType, Tensor};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::Path;

/// The draft-to-target id offsets (int64) and the target-to-draft mask (bool) beside the weights.
pub const D2T: &str = "d2t";
pub const T2D: &str = "t2d";

/// Floating weights are stored as `dtype`: f32, or bf16 to halve the file.
pub fn export(
    blueprint: &DrafterBlueprint,
    weights: &BTreeMap<String, Tensor>,
    dir: &Path,
    dtype: DType,
) -> Result<(), TrainError> {
    std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
    let mut buffers: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, t) in weights {
        let (stored, bytes) = float_bytes(t, dtype)?;
        buffers.push((name.clone(), stored, t.dims().to_vec(), bytes));
    }
    let d2t: Vec<u8> = blueprint.vocab.d2t().iter().flat_map(|o| o.to_le_bytes()).collect();
    buffers.push((D2T.into(), Dtype::I64, vec![blueprint.vocab.len()], d2t));
    let t2d: Vec<u8> = blueprint.vocab.t2d().into_iter().map(u8::from).collect();
    buffers.push((T2D.into(), Dtype::BOOL, vec![blueprint.vocab.target_vocab_size], t2d));
    let path = dir.join("model.safetensors");
    let views = buffers
        .iter()
        .map(|(name, dtype, shape, bytes)| Ok((name.clone(), TensorView::new(*dtype, shape.clone(), bytes)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()
        .map_err(|e| TrainError::io(&path, e))?;
    safetensors::serialize_to_file(views, None, &path).map_err(|e| TrainError::io(&path, e))?;
    write_json(&dir.join("config.json"), &blueprint.config_json()?)
}

fn float_bytes(t: &Tensor, dtype: DType) -> Result<(Dtype, Vec<u8>), TrainError> {
    let flat = t.flatten_all()?;
    Ok(match dtype {
        DType::BF16 => (
            Dtype::BF16,
            flat.to_dtype(DType::BF16)?
                .to_vec1::<half::bf16>()?
                .iter()
                .flat_map(|v| v.to_bits().to_le_bytes())
                .collect(),
        ),
        DType::F32 => (
            Dtype::F32,
            flat.to_dtype(DType::F32)?
                .to_vec1::<f32>()?
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        other => return Err(TrainError::Invalid(format!("cannot export weights as {other:?}"))),
    })
}

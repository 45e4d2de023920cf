//! One captured training sample in the speculators offline format: a safetensors file with
//! `token_ids` [seq] (i64), `hidden_states` [seq, 4, H] (the three captured target states, then
//! the final pre-norm state) and `loss_mask` [seq] (u8, 1 where the token is learned).

use crate::error::TrainError;
use crate::files::write_atomically;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

pub struct Sample {
    pub token_ids: Vec<u32>,
    /// [seq, aux layers + 1, target hidden].
    pub hidden_states: Tensor,
    pub loss_mask: Vec<bool>,
}

impl Sample {
    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    /// Captured states stored as `dtype` (bf16 halves the disk of a large capture).
    pub fn save(&self, path: &Path, dtype: DType) -> Result<(), TrainError> {
        let n = self.len();
        let ids: Vec<i64> = self.token_ids.iter().map(|t| *t as i64).collect();
        let mask: Vec<u8> = self.loss_mask.iter().map(|m| *m as u8).collect();
        let device = Device::Cpu;
        let tensors = HashMap::from([
            ("token_ids".to_owned(), Tensor::from_vec(ids, n, &device)?),
            ("hidden_states".to_owned(), self.hidden_states.to_dtype(dtype)?),
            ("loss_mask".to_owned(), Tensor::from_vec(mask, n, &device)?),
        ]);
        write_atomically(path, |partial| {
            candle_core::safetensors::save(&tensors, partial).map_err(|e| TrainError::io(path, e))
        })
    }

    /// Reads a sample; the hidden states come back in f32.
    pub fn load(path: &Path) -> Result<Self, TrainError> {
        let mut tensors = candle_core::safetensors::load(path, &Device::Cpu).map_err(|e| TrainError::io(path, e))?;
        let mut take = |name: &str| {
            tensors
                .remove(name)
                .ok_or_else(|| TrainError::data(path, format!("no tensor `{name}`")))
        };
        let token_ids: Vec<u32> = take("token_ids")?
            .to_dtype(DType::I64)?
            .to_vec1::<i64>()?
            .into_iter()
            .map(|t| t as u32)
            .collect();
        let hidden_states = take("hidden_states")?.to_dtype(DType::F32)?;
        let loss_mask: Vec<bool> = match take("loss_mask") {
            Ok(m) => m
                .to_dtype(DType::U8)?
                .to_vec1::<u8>()?
                .into_iter()
                .map(|m| m != 0)
                .collect(),
            Err(_) => vec![true; token_ids.len()],
        };
        let n = token_ids.len();
        if hidden_states.rank() != 3 || hidden_states.dim(0)? != n || loss_mask.len() != n {
            return Err(TrainError::data(
                path,
                format!(
                    "expected hidden_states [{n}, layers, hidden] and loss_mask [{n}], found {:?} and [{}]",
                    hidden_states.dims(),
                    loss_mask.len()
                ),
            ));
        }
        Ok(Self {
            token_ids,
            hidden_states,
            loss_mask,
        })
    }
}

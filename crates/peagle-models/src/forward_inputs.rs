//! A forward's inputs on the model's device, made from a `ForwardBatch` before the forward
//! runs: token ids, rotary tables, the attention metadata with its device copy, and the rows
//! whose outputs are kept. The forward itself then copies nothing from the host, so a GPU can
//! capture it as a CUDA graph and replay it over new inputs written into the same tensors.

use crate::batch::ForwardBatch;
use crate::layers::{RopeTables, RotaryEmbedding};
use candle_core::{Device, Result, Tensor};
use peagle_kernels::AttentionMetadata;

pub struct ForwardInputs {
    /// [rows] u32.
    pub ids: Tensor,
    pub rope: RopeTables,
    /// The batch's metadata, with its device copy on a GPU (`AttentionMetadata::on_device`).
    pub attn: AttentionMetadata,
    /// The rows whose logits the forward returns.
    pub logit_rows: RowSelection,
    /// The rows whose hidden states the forward captures.
    pub capture_rows: RowSelection,
}

impl ForwardInputs {
    /// The inputs of `batch` on `device`, its rows rotated by `rope`.
    pub fn new(batch: &ForwardBatch, rope: &RotaryEmbedding, device: &Device) -> Result<Self> {
        let rows = batch.token_ids.len();
        Ok(Self {
            ids: Tensor::from_slice(&batch.token_ids, rows, device)?,
            rope: rope.tables(&batch.positions, device)?,
            attn: batch.attn.clone().on_device(device)?,
            logit_rows: RowSelection::new(&batch.logit_rows, rows, device)?,
            capture_rows: RowSelection::new(&batch.capture_rows, rows, device)?,
        })
    }

    pub fn num_rows(&self) -> usize {
        self.attn.num_rows()
    }
}

/// The rows of a batch's activations that an output keeps (their indices ascend).
pub enum RowSelection {
    Nothing,
    /// Every row: the activation itself serves, with no copy (every decode step's logits, and
    /// the captured states of a batch whose sequences all feed a drafter).
    Everything,
    Rows(Tensor),
}

impl RowSelection {
    fn new(rows: &[u32], total: usize, device: &Device) -> Result<Self> {
        Ok(match rows.len() {
            0 => Self::Nothing,
            n if n == total => Self::Everything,
            n => Self::Rows(Tensor::from_slice(rows, n, device)?),
        })
    }

    /// The kept rows of `x`, None when none is kept.
    pub fn apply(&self, x: &Tensor) -> Result<Option<Tensor>> {
        match self {
            Self::Nothing => Ok(None),
            Self::Everything => Ok(Some(x.clone())),
            Self::Rows(idx) => x.index_select(idx, 0).map(Some),
        }
    }
}

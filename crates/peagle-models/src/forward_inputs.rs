//! A forward's inputs on the model's device, made from a `ForwardBatch` before the forward
//! runs: token ids, rotary tables, the attention metadata with its device copy, and the rows
//! whose outputs are kept. The forward itself then copies nothing from the host, so a GPU can
//! capture it as a CUDA graph and replay it over new inputs written into the same tensors.

use crate::batch::ForwardBatch;
use crate::layers::{RopeTables, RotaryEmbedding};
use candle_core::{bail, Device, Result, Tensor};
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

    /// Writes these inputs' values into `target`'s tensors, of the same shapes: the tensors a
    /// captured CUDA graph reads, before its replay.
    pub fn write_into(&self, target: &ForwardInputs) -> Result<()> {
        let (Some(ours), Some(theirs)) = (&self.attn.device, &target.attn.device) else {
            bail!("inputs written into a graph's need their metadata on the device");
        };
        let pairs = [
            (&self.ids, &target.ids),
            (self.rope.cos(), target.rope.cos()),
            (self.rope.sin(), target.rope.sin()),
            (&ours.packed, &theirs.packed),
            (&ours.slots, &theirs.slots),
        ];
        for (from, to) in pairs
            .into_iter()
            .chain(self.logit_rows.pair(&target.logit_rows)?)
            .chain(self.capture_rows.pair(&target.capture_rows)?)
        {
            if from.shape() != to.shape() {
                bail!(
                    "inputs of shape {:?} written into a graph's of {:?}",
                    from.shape(),
                    to.shape()
                );
            }
            to.slice_set(from, 0, 0)?;
        }
        Ok(())
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

    /// The index tensors of this selection and `other`'s, which must select alike but for the
    /// rows' indices.
    fn pair<'a>(&'a self, other: &'a RowSelection) -> Result<Option<(&'a Tensor, &'a Tensor)>> {
        match (self, other) {
            (Self::Rows(a), Self::Rows(b)) => Ok(Some((a, b))),
            (Self::Nothing, Self::Nothing) | (Self::Everything, Self::Everything) => Ok(None),
            _ => bail!("row selections differ in kind"),
        }
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

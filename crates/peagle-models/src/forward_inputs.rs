//! A forward's inputs on the model's device, made from a `ForwardBatch` before the forward
//! runs: token ids (those already on the device taken where they lie), rotary tables, the
//! attention metadata with its device copy, and the rows whose outputs are kept. The forward
//! itself then copies nothing from the host, so a GPU can capture it as a CUDA graph and
//! replay it over new inputs written into the same tensors.
//! The integer inputs are views of one tensor and the rotary tables of another: two uploads
//! a forward, straight into a graph's inputs on its replays, however many inputs there are.

use crate::batch::ForwardBatch;
use crate::layers::{RopeTables, RotaryEmbedding};
use candle_core::{bail, Device, Result, Tensor};
use peagle_kernels::{AttentionMetadata, DeviceMetadata};

pub struct ForwardInputs {
    /// Every u32 input end to end, in the order `new` lays them out.
    integers: Tensor,
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
        let mut attn = batch.attn.clone();
        let (values, lengths) = integers(batch, !device.is_cpu());
        let integers = Tensor::from_vec(values, lengths.iter().sum::<usize>(), device)?;
        let mut views = Vec::with_capacity(lengths.len());
        let mut at = 0;
        for length in lengths {
            views.push(integers.narrow(0, at, length)?);
            at += length;
        }
        let [ids, packed, slots, logit_rows, capture_rows] = <[Tensor; 5]>::try_from(views).expect("five parts");
        if !device.is_cpu() {
            attn.device = Some(DeviceMetadata { packed, slots });
        }
        for tokens in &batch.device_tokens {
            tokens.write_into(&ids)?;
        }
        Ok(Self {
            integers,
            ids,
            rope: rope.tables(&batch.positions, device)?,
            attn,
            logit_rows: RowSelection::new(logit_rows, batch.logit_rows.len(), rows),
            capture_rows: RowSelection::new(capture_rows, batch.capture_rows.len(), rows),
        })
    }

    /// Writes the inputs of `batch`, its rows rotated by `rope`, into `target`'s tensors, laid
    /// out alike: the tensors a captured CUDA graph reads, before its replay. Two copies from
    /// the host, straight into them.
    pub fn upload_into(batch: &ForwardBatch, rope: &RotaryEmbedding, target: &ForwardInputs) -> Result<()> {
        let Some(device) = &target.attn.device else {
            bail!("inputs written into a graph's need their metadata on the device");
        };
        let (values, lengths) = integers(batch, true);
        let rows = batch.token_ids.len();
        // Equal totals of equal parts: the ids and metadata, with the rows kept alike, fix the
        // layout of the rest.
        if lengths[0] != target.ids.dim(0)?
            || lengths[1] != device.packed.dim(0)?
            || values.len() != target.integers.dim(0)?
            || !target.logit_rows.matches(batch.logit_rows.len(), rows)
            || !target.capture_rows.matches(batch.capture_rows.len(), rows)
        {
            bail!("inputs written into a graph's are laid out otherwise");
        }
        peagle_kernels::upload_into(&target.integers, &values)?;
        for tokens in &batch.device_tokens {
            tokens.write_into(&target.ids)?;
        }
        peagle_kernels::upload_into(target.rope.values(), &rope.table_values(&batch.positions))
    }
}

/// Every u32 input of `batch` end to end, and each part's length: the ids, on a GPU
/// (`on_gpu`) the attention metadata and cache slots, then the indices of the rows kept where
/// not all or none are.
fn integers(batch: &ForwardBatch, on_gpu: bool) -> (Vec<u32>, [usize; 5]) {
    let rows = batch.token_ids.len();
    let packed = if on_gpu { batch.attn.packed() } else { Vec::new() };
    let slots: &[u32] = if on_gpu { &batch.attn.slot_mapping } else { &[] };
    let selected = |r: &[u32]| if r.is_empty() || r.len() == rows { 0 } else { r.len() };
    let parts = [
        &batch.token_ids[..],
        &packed,
        slots,
        &batch.logit_rows[..selected(&batch.logit_rows)],
        &batch.capture_rows[..selected(&batch.capture_rows)],
    ];
    (parts.concat(), parts.map(<[u32]>::len))
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
    /// `count` of `total` rows, whose indices are `indices` where the count is neither.
    fn new(indices: Tensor, count: usize, total: usize) -> Self {
        match count {
            0 => Self::Nothing,
            n if n == total => Self::Everything,
            _ => Self::Rows(indices),
        }
    }

    /// Whether a selection of `count` of `total` rows is made as this one is, but perhaps for
    /// the rows' indices.
    fn matches(&self, count: usize, total: usize) -> bool {
        match self {
            Self::Nothing => count == 0,
            Self::Everything => count != 0 && count == total,
            Self::Rows(idx) => count != 0 && count != total && idx.dim(0).is_ok_and(|n| n == count),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{BatchBuilder, Rows};
    use crate::config::{RopeConfig, RopeScaling};

    /// The inputs are views of two uploads, each holding what the batch says.
    #[test]
    fn the_views_hold_the_batch() {
        let mut batch = BatchBuilder::new(4);
        batch.add(&[5, 6, 7], 2, &[0, 1], Rows::Tail(1), Rows::None).unwrap();
        batch.add(&[8, 9], 0, &[2], Rows::All, Rows::None).unwrap();
        let batch = batch.build();
        let rope = RotaryEmbedding::new(
            8,
            &RopeConfig {
                theta: 10_000.0,
                scaling: RopeScaling::None,
            },
        );
        let inputs = ForwardInputs::new(&batch, &rope, &Device::Cpu).unwrap();
        assert_eq!(inputs.ids.to_vec1::<u32>().unwrap(), [5, 6, 7, 8, 9]);
        let RowSelection::Rows(kept) = &inputs.logit_rows else {
            panic!("3 of 5 rows are kept")
        };
        assert_eq!(kept.to_vec1::<u32>().unwrap(), batch.logit_rows);
        assert_eq!(batch.logit_rows, [2, 3, 4]);
        assert!(matches!(inputs.capture_rows, RowSelection::Nothing));
        let (cos, sin) = (inputs.rope.cos(), inputs.rope.sin());
        assert_eq!((cos.dims(), sin.dims()), ([5, 4].as_slice(), [5, 4].as_slice()));
        let (position, freq) = (batch.positions[1] as f32, rope.inv_freq()[3]);
        assert_eq!(cos.to_vec2::<f32>().unwrap()[1][3], (position * freq).cos());
        assert_eq!(sin.to_vec2::<f32>().unwrap()[1][3], (position * freq).sin());
    }
}

//! A forward's inputs on the model's device, made from a `ForwardBatch` before the forward
//! runs: token ids (those already on the device taken where they lie), rotary tables, the
//! attention metadata with its device copy, and the rows whose outputs are kept. The forward
//! itself then copies nothing from the host, so a GPU can capture it as a CUDA graph and
//! replay it over new inputs written into the same tensors.
//! The integer inputs are views of one tensor, uploaded at once, straight into a graph's inputs
//! on its replays, however many inputs there are. The rotary tables are the table of every
//! position, read by the rows' positions, where the model placed one on its GPU
//! (`RotaryEmbedding::place_table`); else the rows' own, a second upload.
//! On a GPU the integers also carry the indices of the kernels issued beside the forward (the
//! device tokens' places and picks, a drafter pass's gather), so those add no upload of their
//! own.

use crate::batch::ForwardBatch;
use crate::layers::{RopeTables, RotaryEmbedding};
use candle_core::{bail, Device, Result, Tensor};
use peagle_kernels::{AttentionMetadata, DeviceMetadata, Indices};
use std::ops::Range;

/// Kernel indices the integers hold a row, at most: a device token's place and pick, or a
/// drafter pass's row to gather and a logit row's place.
const INDICES_A_ROW: usize = 2;

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
    /// On a GPU, the kernel indices (`INDICES_A_ROW` a row): the caller's, then the device
    /// tokens' places and picks, then zeros. None on the CPU, whose kernels read the host's.
    kernel_indices: Option<Tensor>,
}

impl ForwardInputs {
    /// The inputs of `batch` on `device`, its rows rotated by `rope`; `indices` are kernel
    /// indices the caller reads back by `indices` (on a GPU, uploaded with the rest).
    pub fn new(batch: &ForwardBatch, rope: &RotaryEmbedding, device: &Device, indices: &[u32]) -> Result<Self> {
        let rows = batch.token_ids.len();
        let mut attn = batch.attn.clone();
        let (values, lengths) = integers(batch, !device.is_cpu(), indices)?;
        let integers = Tensor::from_vec(values, lengths.iter().sum::<usize>(), device)?;
        let mut views = Vec::with_capacity(lengths.len());
        let mut at = 0;
        for length in lengths {
            views.push(integers.narrow(0, at, length)?);
            at += length;
        }
        let [ids, packed, slots, logit_rows, capture_rows, positions, kernel_indices] =
            <[Tensor; 7]>::try_from(views).expect("seven parts");
        let on_gpu = !device.is_cpu();
        let kernel_indices = on_gpu.then_some(kernel_indices);
        if on_gpu {
            attn.device = Some(DeviceMetadata { packed, slots });
        }
        let inputs = Self {
            integers,
            ids,
            rope: rope.forward_tables(&batch.positions, on_gpu.then_some(positions), device)?,
            attn,
            logit_rows: RowSelection::new(logit_rows, batch.logit_rows.len(), rows),
            capture_rows: RowSelection::new(capture_rows, batch.capture_rows.len(), rows),
            kernel_indices,
        };
        inputs.write_device_tokens(batch, indices.len())?;
        Ok(inputs)
    }

    /// Writes the inputs of `batch`, its rows rotated by `rope`, and the kernel indices
    /// `indices` into `target`'s tensors, laid out alike: the tensors a captured CUDA graph
    /// reads, before its replay. One copy from the host, straight into them; two where the rows
    /// have their own rotary tables.
    pub fn upload_into(
        batch: &ForwardBatch,
        rope: &RotaryEmbedding,
        target: &ForwardInputs,
        indices: &[u32],
    ) -> Result<()> {
        let Some(device) = &target.attn.device else {
            bail!("inputs written into a graph's need their metadata on the device");
        };
        let (values, lengths) = integers(batch, true, indices)?;
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
        target.rope.check_positions(&batch.positions)?;
        peagle_kernels::upload_into(&target.integers, &values)?;
        target.write_device_tokens(batch, indices.len())?;
        match target.rope.by_position() {
            true => Ok(()),
            false => peagle_kernels::upload_into(target.rope.values(), &rope.table_values(&batch.positions)),
        }
    }

    /// `values`, the kernel indices at `range` of those the inputs were made or written with:
    /// on a GPU, where the upload put them.
    pub fn indices<'a>(&self, range: Range<usize>, values: &'a [u32]) -> Result<Indices<'a>> {
        if values.len() != range.len() {
            bail!("{} kernel indices read as {range:?}", values.len());
        }
        match self.uploaded_indices(range)? {
            Some(uploaded) => Indices::uploaded(values, uploaded),
            None => Ok(Indices::new(values)),
        }
    }

    /// The kernel indices at `range` where the upload put them, on a GPU; None on the CPU.
    pub fn uploaded_indices(&self, range: Range<usize>) -> Result<Option<Tensor>> {
        self.kernel_indices
            .as_ref()
            .map(|all| all.narrow(0, range.start, range.len()))
            .transpose()
    }

    /// Writes the batch's device tokens into the token ids, their places and picks read where
    /// `integers` put them, after the caller's `before` kernel indices.
    fn write_device_tokens(&self, batch: &ForwardBatch, before: usize) -> Result<()> {
        let mut at = before;
        for tokens in &batch.device_tokens {
            let n = tokens.rows.len();
            let rows = self.indices(at..at + n, &tokens.rows)?;
            let picks = self.indices(at + n..at + 2 * n, &tokens.picks)?;
            peagle_kernels::take_ids(&self.ids, &rows, &tokens.ids, &picks, None)?;
            at += 2 * n;
        }
        Ok(())
    }
}

/// Every u32 input of `batch` end to end, and each part's length: the ids, on a GPU
/// (`on_gpu`) the attention metadata and cache slots, then the indices of the rows kept where
/// not all or none are, then on a GPU the rows' positions (which the table of every position
/// is read by) and the kernel indices: `indices`, the device tokens' places and picks, and
/// zeros to `INDICES_A_ROW` a row, so that the layout depends on the rows alone.
fn integers(batch: &ForwardBatch, on_gpu: bool, indices: &[u32]) -> Result<(Vec<u32>, [usize; 7])> {
    let rows = batch.token_ids.len();
    let packed = if on_gpu { batch.attn.packed() } else { Vec::new() };
    let slots: &[u32] = if on_gpu { &batch.attn.slot_mapping } else { &[] };
    let positions: &[u32] = if on_gpu { &batch.positions } else { &[] };
    let selected = |r: &[u32]| if r.is_empty() || r.len() == rows { 0 } else { r.len() };
    let mut kernel_indices = Vec::new();
    if on_gpu {
        kernel_indices.extend_from_slice(indices);
        for tokens in &batch.device_tokens {
            kernel_indices.extend_from_slice(&tokens.rows);
            kernel_indices.extend_from_slice(&tokens.picks);
        }
        let room = INDICES_A_ROW * rows;
        if kernel_indices.len() > room {
            bail!(
                "{} kernel indices for a forward of {rows} rows, which holds {room}",
                kernel_indices.len()
            );
        }
        kernel_indices.resize(room, 0);
    }
    let parts = [
        &batch.token_ids[..],
        &packed,
        slots,
        &batch.logit_rows[..selected(&batch.logit_rows)],
        &batch.capture_rows[..selected(&batch.capture_rows)],
        positions,
        &kernel_indices,
    ];
    Ok((parts.concat(), parts.map(<[u32]>::len)))
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
    use crate::device_ids::DeviceIds;

    /// The inputs are views of two tensors, each holding what the batch says.
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
        let inputs = ForwardInputs::new(&batch, &rope, &Device::Cpu, &[]).unwrap();
        assert_eq!(inputs.ids.to_vec1::<u32>().unwrap(), [5, 6, 7, 8, 9]);
        let RowSelection::Rows(kept) = &inputs.logit_rows else {
            panic!("3 of 5 rows are kept")
        };
        assert_eq!(kept.to_vec1::<u32>().unwrap(), batch.logit_rows);
        assert_eq!(batch.logit_rows, [2, 3, 4]);
        assert!(matches!(inputs.capture_rows, RowSelection::Nothing));
        assert!(!inputs.rope.by_position(), "the CPU rotates by the rows' own tables");
        let tables = inputs.rope.values().to_vec3::<f32>().unwrap();
        assert_eq!((tables.len(), tables[0].len(), tables[0][0].len()), (2, 5, 4));
        let (position, freq) = (batch.positions[1] as f32, rope.inv_freq()[3]);
        assert_eq!(tables[0][1][3], (position * freq).cos());
        assert_eq!(tables[1][1][3], (position * freq).sin());
    }

    /// A placed table holds, for each position, what a batch's own tables hold for it; a
    /// forward reads it only with its positions on the device, and a position past it is an
    /// error.
    #[test]
    fn the_table_of_every_position_holds_each_rows_tables() {
        let config = RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::None,
        };
        let mut rope = RotaryEmbedding::new(8, &config);
        rope.place_table(6, &Device::Cpu).unwrap();
        let positions = [4u32, 0, 5];
        let own = rope.tables(&positions, &Device::Cpu).unwrap();
        let on_device = Tensor::new(&positions, &Device::Cpu).unwrap();
        let by_position = rope.forward_tables(&positions, Some(on_device), &Device::Cpu).unwrap();
        assert!(by_position.by_position() && !own.by_position());
        let gathered = by_position
            .rotation(8)
            .tables
            .index_select(&Tensor::new(&positions, &Device::Cpu).unwrap(), 1);
        assert_eq!(
            gathered.unwrap().to_vec3::<f32>().unwrap(),
            own.values().to_vec3::<f32>().unwrap()
        );
        let x = Tensor::arange(0f32, 24.0, &Device::Cpu)
            .unwrap()
            .reshape((3, 8))
            .unwrap();
        let (a, b) = (by_position.apply(&x, 1, 8).unwrap(), own.apply(&x, 1, 8).unwrap());
        assert_eq!(a.to_vec2::<f32>().unwrap(), b.to_vec2::<f32>().unwrap());
        assert!(!rope
            .forward_tables(&positions, None, &Device::Cpu)
            .unwrap()
            .by_position());
        own.check_positions(&[2, 6]).unwrap();
        let err = by_position.check_positions(&[2, 6]).unwrap_err().to_string();
        assert!(
            err.contains("position 6 is past the rotary table's 6 positions"),
            "{err}"
        );
        let on_device = Tensor::new(&[6u32], &Device::Cpu).unwrap();
        assert!(rope.forward_tables(&[6], Some(on_device), &Device::Cpu).is_err());
    }

    /// On a GPU the integers end in room for two kernel indices a row, whatever the batch
    /// asks, so a graph's layout depends on its rows alone: the caller's indices, then each
    /// tensor's device tokens' places and picks, then zeros. More than fit is an error.
    #[test]
    fn kernel_indices_end_the_integers_in_room_fixed_by_the_rows() {
        let ids = Tensor::new(&[40u32, 41, 42], &Device::Cpu).unwrap();
        let drafts = DeviceIds {
            ids: ids.clone(),
            picks: vec![2, 0],
        };
        let mut batch = BatchBuilder::new(4);
        batch.add_then(&[5], &drafts, 0, &[0], Rows::All, Rows::None).unwrap();
        batch.add(&[8], 0, &[1], Rows::All, Rows::None).unwrap();
        let batch = batch.build();
        let (values, lengths) = integers(&batch, true, &[9, 9]).unwrap();
        let kernel_indices = &values[values.len() - lengths[6]..];
        // Before them, the rows' positions.
        assert_eq!(
            &values[values.len() - lengths[6] - lengths[5]..][..lengths[5]],
            batch.positions
        );
        // Places 1 and 2 of the four rows take picks 2 and 0.
        assert_eq!(kernel_indices, [9, 9, 1, 2, 2, 0, 0, 0]);
        assert!(integers(&batch, true, &[9; 5]).is_err(), "nine indices for four rows");
        let (_, lengths) = integers(&batch, false, &[9, 9]).unwrap();
        assert_eq!(lengths[6], 0, "the CPU's kernels read the host's indices");
        assert_eq!(lengths[5], 0, "the CPU rotates by the rows' own tables");
    }
}

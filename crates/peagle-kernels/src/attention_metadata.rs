//! Where a flattened batch's query rows live in the paged KV cache, as attention and the KV
//! write read it: on the host, and packed on a GPU.

use crate::error::bad_input;
use crate::kv_write::check_slots;
use candle_core::{Device, Result, Tensor};

/// Where every query row of a flattened batch lives in the paged KV cache.
#[derive(Debug, Clone, Default)]
pub struct AttentionMetadata {
    pub block_size: usize,
    /// Offset of each sequence's first query row; one entry per sequence plus the total.
    pub query_start: Vec<usize>,
    /// Tokens cached for each sequence once this batch's rows are written.
    pub context_lens: Vec<usize>,
    /// Physical block ids of each sequence, in logical order.
    pub block_tables: Vec<Vec<u32>>,
    /// Cache slot (block * block_size + offset) of every query row.
    pub slot_mapping: Vec<u32>,
    /// The same metadata where a GPU's kernels read it (`on_device`); None on the CPU.
    pub device: Option<DeviceMetadata>,
}

/// A batch's attention metadata on a GPU: uploaded once a forward, not once a layer, and
/// never during a forward, which a captured CUDA graph could not replay.
#[derive(Debug, Clone)]
pub struct DeviceMetadata {
    /// `AttentionMetadata::packed`, which `kernels/paged_attention.cu` reads.
    pub packed: Tensor,
    /// The cache slots, which `kernels/kv_write.cu` reads.
    pub slots: Tensor,
}

impl AttentionMetadata {
    pub fn num_rows(&self) -> usize {
        self.query_start.last().copied().unwrap_or(0)
    }

    pub fn num_sequences(&self) -> usize {
        self.context_lens.len()
    }

    /// This metadata with its copy on `device` for a GPU's kernels (none on the CPU, whose
    /// kernels read the host's).
    pub fn on_device(mut self, device: &Device) -> Result<Self> {
        self.device = match device {
            Device::Cpu => None,
            _ => Some(DeviceMetadata {
                packed: Tensor::from_vec(self.packed(), self.packed_len(), device)?,
                slots: Tensor::from_slice(&self.slot_mapping, self.slot_mapping.len(), device)?,
            }),
        };
        Ok(self)
    }

    /// The layout `kernels/paged_attention.cu` reads: each row's sequence, each row's
    /// position, each sequence's offset into the block tables, then the tables.
    pub fn packed(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.packed_len());
        for (s, w) in self.query_start.windows(2).enumerate() {
            out.extend((w[0]..w[1]).map(|_| s as u32));
        }
        out.extend(self.rows().into_iter().map(|(_, pos)| pos as u32));
        let mut offset = 0;
        for table in &self.block_tables {
            out.push(offset as u32);
            offset += table.len();
        }
        for table in &self.block_tables {
            out.extend_from_slice(table);
        }
        out
    }

    pub(crate) fn packed_len(&self) -> usize {
        let tables: usize = self.block_tables.iter().map(Vec::len).sum();
        2 * self.num_rows() + self.num_sequences() + tables
    }

    /// Sequence index and position of every query row.
    pub(crate) fn rows(&self) -> Vec<(usize, usize)> {
        let mut rows = Vec::with_capacity(self.num_rows());
        for (s, w) in self.query_start.windows(2).enumerate() {
            let q = w[1] - w[0];
            rows.extend((0..q).map(|i| (s, self.context_lens[s] - q + i)));
        }
        rows
    }

    /// Checks the metadata against a cache of `num_slots` slots: what every kernel that reads
    /// it relies on.
    pub fn validate(&self, num_slots: usize) -> Result<()> {
        let seqs = self.num_sequences();
        let fail = |msg: String| Err(bad_input("paged_attention", msg));
        if self.block_size == 0 {
            return fail("block_size is 0".into());
        }
        if self.query_start.len() != seqs + 1 || self.block_tables.len() != seqs {
            return fail(format!(
                "{seqs} sequences but {} query offsets and {} block tables",
                self.query_start.len(),
                self.block_tables.len()
            ));
        }
        if self.slot_mapping.len() != self.num_rows() {
            return fail(format!(
                "{} slots for {} rows",
                self.slot_mapping.len(),
                self.num_rows()
            ));
        }
        for s in 0..seqs {
            let (q0, q1) = (self.query_start[s], self.query_start[s + 1]);
            let ctx = self.context_lens[s];
            if q1 < q0 || q1 - q0 > ctx {
                return fail(format!(
                    "sequence {s}: {} query rows but {ctx} cached tokens",
                    q1.wrapping_sub(q0)
                ));
            }
            let table = &self.block_tables[s];
            if table.len() * self.block_size < ctx {
                return fail(format!("sequence {s}: {} blocks cannot hold {ctx} tokens", table.len()));
            }
            if let Some(b) = table.iter().find(|b| (**b as usize + 1) * self.block_size > num_slots) {
                return fail(format!("sequence {s}: block {b} outside the cache"));
            }
        }
        check_slots("paged_attention", &self.slot_mapping, num_slots)
    }
}

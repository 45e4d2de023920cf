//! The flattened batch (vLLM v1 style): the tokens of all scheduled sequences in one list, so
//! prefill chunks, decode tokens and verification windows share one forward.

use crate::device_ids::{DeviceIds, DeviceTokens};
use candle_core::{bail, Result};
use peagle_kernels::{AttentionMetadata, PAD_SLOT};
use std::ops::Range;

#[derive(Clone)]
pub struct ForwardBatch {
    pub token_ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub attn: AttentionMetadata,
    /// Rows whose logits the forward returns, in this order.
    pub logit_rows: Vec<u32>,
    /// Rows whose hidden states the forward captures, in this order.
    pub capture_rows: Vec<u32>,
    /// Rows whose tokens lie on the device (`token_ids` holds placeholders there), one entry
    /// per tensor they lie in.
    pub device_tokens: Vec<DeviceTokens>,
}

impl ForwardBatch {
    /// This batch grown to `sequences` sequences whose block tables all hold `table_width`
    /// blocks: the fixed shape of a captured CUDA graph. Each new sequence has as many rows as
    /// the first, over token 0 at positions from 0, reading block 0 and writing nothing
    /// (`PAD_SLOT`); its outputs are kept as the batch's are, all rows or none. A row's
    /// results do not depend on the rest of its batch, so the batch's own rows come out of the
    /// padded batch first and unchanged.
    pub fn padded(&self, sequences: usize, table_width: usize) -> Result<ForwardBatch> {
        let attn = &self.attn;
        let (rows, seqs) = (self.token_ids.len(), attn.num_sequences());
        let rows_each = attn.query_start.get(1).copied().unwrap_or(0);
        let all_or_none = |kept: &[u32]| kept.is_empty() || kept.len() == rows;
        if seqs == 0 || sequences < seqs || rows_each == 0 {
            bail!("{seqs} sequences cannot be padded to {sequences}");
        }
        if table_width * attn.block_size < rows_each || attn.block_tables.iter().any(|t| t.len() > table_width) {
            bail!("block tables longer than {table_width} blocks, or too short for {rows_each} rows");
        }
        if !all_or_none(&self.logit_rows) || !all_or_none(&self.capture_rows) {
            bail!("a padded batch keeps the outputs of all its rows or of none");
        }
        let mut padded = ForwardBatch {
            token_ids: self.token_ids.clone(),
            positions: self.positions.clone(),
            attn: AttentionMetadata {
                block_tables: attn
                    .block_tables
                    .iter()
                    .map(|t| [t.as_slice(), &vec![0; table_width - t.len()]].concat())
                    .collect(),
                ..attn.clone()
            },
            logit_rows: self.logit_rows.clone(),
            capture_rows: self.capture_rows.clone(),
            device_tokens: self.device_tokens.clone(),
        };
        for _ in seqs..sequences {
            let p = &mut padded;
            let first = p.token_ids.len();
            p.token_ids.extend(std::iter::repeat_n(0, rows_each));
            p.positions.extend(0..rows_each as u32);
            p.attn.slot_mapping.extend(std::iter::repeat_n(PAD_SLOT, rows_each));
            p.attn.query_start.push(first + rows_each);
            p.attn.context_lens.push(rows_each);
            p.attn.block_tables.push(vec![0; table_width]);
            let new_rows = (first as u32)..(first + rows_each) as u32;
            if !self.logit_rows.is_empty() {
                p.logit_rows.extend(new_rows.clone());
            }
            if !self.capture_rows.is_empty() {
                p.capture_rows.extend(new_rows);
            }
        }
        Ok(padded)
    }

    /// This batch with every sequence grown to `rows_each` rows: the fixed rows a sequence has
    /// in a drafter pass's CUDA graph, where sequences have as many rows as they have slots.
    /// A sequence's new rows follow its own, over token 0 at the next positions, writing
    /// nothing (`PAD_SLOT`); its block table grows by block 0 as far as they reach, which they
    /// read. A row attends to the positions up to its own, so the batch's own rows give the
    /// bits they give unpadded. The rows kept are the same rows at their new indices. Also
    /// returns, for each new row, the row of this batch it stands for (a new row, its
    /// sequence's last), by which per-row inputs are gathered.
    pub fn with_rows_each(&self, rows_each: usize) -> Result<(ForwardBatch, Vec<u32>)> {
        let attn = &self.attn;
        let bs = attn.block_size;
        let mut grown = BatchBuilder::new(bs).build();
        let mut sources = Vec::with_capacity(rows_each * attn.num_sequences());
        // The new index of each row of this batch.
        let mut moved = Vec::with_capacity(self.token_ids.len());
        for (s, w) in attn.query_start.windows(2).enumerate() {
            let (first, rows) = (w[0], w[1] - w[0]);
            if rows == 0 || rows > rows_each {
                bail!("a sequence of {rows} rows cannot be padded to {rows_each}");
            }
            let b = &mut grown;
            let at = b.token_ids.len();
            moved.extend((at..at + rows).map(|r| r as u32));
            let pad = rows_each - rows;
            let last = first + rows - 1;
            b.token_ids.extend_from_slice(&self.token_ids[first..w[1]]);
            b.token_ids.extend(std::iter::repeat_n(0, pad));
            let next = self.positions[last] + 1;
            b.positions.extend_from_slice(&self.positions[first..w[1]]);
            b.positions.extend(next..next + pad as u32);
            b.attn.slot_mapping.extend_from_slice(&attn.slot_mapping[first..w[1]]);
            b.attn.slot_mapping.extend(std::iter::repeat_n(PAD_SLOT, pad));
            let context = attn.context_lens[s] + pad;
            let table = &attn.block_tables[s];
            let reach = context.div_ceil(bs).max(table.len());
            b.attn
                .block_tables
                .push([table.as_slice(), &vec![0; reach - table.len()]].concat());
            b.attn.context_lens.push(context);
            b.attn.query_start.push(at + rows_each);
            sources.extend((first..w[1]).map(|r| r as u32));
            sources.extend(std::iter::repeat_n(last as u32, pad));
        }
        let moved_rows = |rows: &[u32]| rows.iter().map(|&r| moved[r as usize]).collect();
        grown.logit_rows = moved_rows(&self.logit_rows);
        grown.capture_rows = moved_rows(&self.capture_rows);
        grown.device_tokens = self
            .device_tokens
            .iter()
            .map(|d| DeviceTokens {
                rows: moved_rows(&d.rows),
                ..d.clone()
            })
            .collect();
        Ok((grown, sources))
    }
}

/// Which of a sequence's rows an output is wanted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    None,
    /// The last n rows (all of them if the sequence has fewer).
    Tail(usize),
    All,
}

impl Rows {
    fn select(self, rows: Range<usize>) -> Range<usize> {
        match self {
            Rows::None => rows.end..rows.end,
            Rows::Tail(n) => rows.end.saturating_sub(n).max(rows.start)..rows.end,
            Rows::All => rows,
        }
    }
}

/// Where one sequence's outputs landed: indices into `ForwardOutput::logits` and the captured
/// hidden states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceRows {
    pub logits: Range<usize>,
    pub captured: Range<usize>,
}

pub struct BatchBuilder {
    batch: ForwardBatch,
}

impl BatchBuilder {
    pub fn new(block_size: usize) -> Self {
        Self {
            batch: ForwardBatch {
                token_ids: Vec::new(),
                positions: Vec::new(),
                attn: AttentionMetadata {
                    block_size,
                    query_start: vec![0],
                    ..Default::default()
                },
                logit_rows: Vec::new(),
                capture_rows: Vec::new(),
                device_tokens: Vec::new(),
            },
        }
    }

    /// Adds `tokens` of one sequence at positions `start..start + tokens.len()`; its earlier
    /// positions must already be in the cache blocks of `block_table`.
    pub fn add(
        &mut self,
        tokens: &[u32],
        start: usize,
        block_table: &[u32],
        logits: Rows,
        capture: Rows,
    ) -> Result<SequenceRows> {
        let b = &mut self.batch;
        let bs = b.attn.block_size;
        let end = start + tokens.len();
        if tokens.is_empty() {
            bail!("a sequence in a batch needs at least one token");
        }
        if block_table.len() * bs < end {
            bail!("{} blocks of {bs} cannot hold {end} tokens", block_table.len());
        }
        let first_row = b.token_ids.len();
        let rows = first_row..first_row + tokens.len();
        b.token_ids.extend_from_slice(tokens);
        for pos in start..end {
            b.positions.push(pos as u32);
            b.attn
                .slot_mapping
                .push(block_table[pos / bs] * bs as u32 + (pos % bs) as u32);
        }
        b.attn.query_start.push(rows.end);
        b.attn.context_lens.push(end);
        b.attn.block_tables.push(block_table.to_vec());
        let logits_at = b.logit_rows.len();
        let captured_at = b.capture_rows.len();
        b.logit_rows.extend(logits.select(rows.clone()).map(|r| r as u32));
        b.capture_rows.extend(capture.select(rows).map(|r| r as u32));
        Ok(SequenceRows {
            logits: logits_at..b.logit_rows.len(),
            captured: captured_at..b.capture_rows.len(),
        })
    }

    /// Adds a sequence as `add` does, its tokens `tokens` followed by `then`, which lie on the
    /// device: the forward takes them there (`DeviceTokens`).
    pub fn add_then(
        &mut self,
        tokens: &[u32],
        then: &DeviceIds,
        start: usize,
        block_table: &[u32],
        logits: Rows,
        capture: Rows,
    ) -> Result<SequenceRows> {
        let first = (self.batch.token_ids.len() + tokens.len()) as u32;
        let placeholders = std::iter::repeat_n(0, then.len());
        let all: Vec<u32> = tokens.iter().copied().chain(placeholders).collect();
        let placed = self.add(&all, start, block_table, logits, capture)?;
        if then.is_empty() {
            return Ok(placed);
        }
        let rows = first..first + then.len() as u32;
        let same_tensor = self
            .batch
            .device_tokens
            .iter_mut()
            .find(|d| d.ids.id() == then.ids.id());
        match same_tensor {
            Some(d) => {
                d.rows.extend(rows);
                d.picks.extend_from_slice(&then.picks);
            }
            None => self.batch.device_tokens.push(DeviceTokens {
                rows: rows.collect(),
                ids: then.ids.clone(),
                picks: then.picks.clone(),
            }),
        }
        Ok(placed)
    }

    pub fn is_empty(&self) -> bool {
        self.batch.token_ids.is_empty()
    }

    pub fn build(self) -> ForwardBatch {
        self.batch
    }
}

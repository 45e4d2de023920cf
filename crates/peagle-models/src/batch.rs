//! The flattened batch (vLLM v1 style): the tokens of all scheduled sequences in one list, so
//! prefill chunks, decode tokens and verification windows share one forward.

use candle_core::{bail, Result};
use peagle_kernels::{AttentionMetadata, PAD_SLOT};
use std::ops::Range;

pub struct ForwardBatch {
    pub token_ids: Vec<u32>,
    pub positions: Vec<u32>,
    pub attn: AttentionMetadata,
    /// Rows whose logits the forward returns, in this order.
    pub logit_rows: Vec<u32>,
    /// Rows whose hidden states the forward captures, in this order.
    pub capture_rows: Vec<u32>,
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

    pub fn is_empty(&self) -> bool {
        self.batch.token_ids.is_empty()
    }

    pub fn build(self) -> ForwardBatch {
        self.batch
    }
}

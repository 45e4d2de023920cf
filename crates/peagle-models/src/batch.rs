//! The flattened batch (vLLM v1 style): the tokens of all scheduled sequences in one list, so
//! prefill chunks, decode tokens and verification windows share one forward.

use candle_core::{bail, Result};
use peagle_kernels::AttentionMetadata;
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

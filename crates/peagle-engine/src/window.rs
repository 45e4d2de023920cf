//! A verification window: the rows of a step's logits that choose one sequence's tokens, and
//! the drafts they verify (`Window`), or the rows alone, as they are known before the drafts
//! are read on the host (`WindowRows`).

use crate::sequence::Sequence;

/// One sequence's verification window `[b, d1..dK]`: rows `first_row..first_row + K + 1` of
/// the step's logits, row i following `d_i` (row 0: the last committed token `b`).
#[derive(Clone, Copy)]
pub struct Window<'a> {
    pub first_row: usize,
    pub drafts: &'a [u32],
    /// Position in the sequence of the token row 0 chooses: the key of its sampler's draws.
    pub position: usize,
    /// Whose sampling parameters, sampler, penalties (over its tokens so far) and
    /// log-probability request apply.
    pub seq: &'a Sequence,
}

impl<'a> Window<'a> {
    /// Its rows, as they are known before its drafts are read.
    pub fn rows(&self) -> WindowRows<'a> {
        WindowRows {
            first_row: self.first_row,
            len: self.drafts.len() + 1,
            position: self.position,
            seq: self.seq,
        }
    }
}

impl<'a> WindowRows<'a> {
    /// The window of these rows, verifying `drafts` (one fewer than its rows).
    pub fn with_drafts(self, drafts: &'a [u32]) -> Window<'a> {
        Window {
            first_row: self.first_row,
            drafts,
            position: self.position,
            seq: self.seq,
        }
    }
}

/// Where a window's rows lie and whose they are, known before its drafts are on the host:
/// what the device's choices of its rows are issued from (`IssuedChoices`).
#[derive(Clone, Copy)]
pub struct WindowRows<'a> {
    pub first_row: usize,
    /// The window's rows: its drafts and one.
    pub len: usize,
    pub position: usize,
    pub seq: &'a Sequence,
}

//! What the ops over chosen rows of a step's logits share (`argmax_rows`, `row_candidates`,
//! `gumbel_sample`): the requested rows checked, and the op applied where the logits are, to
//! f32 on the CPU (where it is the kernel's reference), its u32 words left there until read
//! (`Issued`).

use crate::error::bad_input;
use candle_core::{CustomOp1, DType, Result, Tensor};

/// An op's results over requested rows, issued where the logits are and read later. On a GPU,
/// issuing waits for nothing; reading waits for the op and all issued before it, so results
/// issued behind a forward are read with one wait for both.
pub struct Issued<T> {
    /// The results' words, `per_result` words a result.
    words: Tensor,
    per_result: usize,
    unpack: fn(&[u32]) -> T,
}

impl<T> Issued<T> {
    /// Results of `per_result` words each, every one unpacked by `unpack`.
    pub(crate) fn new(words: Tensor, per_result: usize, unpack: fn(&[u32]) -> T) -> Self {
        Self {
            words,
            per_result,
            unpack,
        }
    }

    /// One result per request, in order.
    pub fn read(self) -> Result<Vec<T>> {
        let words: Vec<u32> = self.words.flatten_all()?.to_vec1()?;
        Ok(words.chunks_exact(self.per_result).map(self.unpack).collect())
    }
}

impl Issued<u32> {
    /// One word a result: a token id.
    pub(crate) fn tokens(words: Tensor) -> Self {
        Self::new(words, 1, |word| word[0])
    }
}

/// `op`'s output words over `logits` ([rows, cols]), left where the logits are, after checking
/// that every one of `rows`, the requests' rows, lies in it.
pub(crate) fn apply_to_rows(
    name: &'static str,
    logits: &Tensor,
    mut rows: impl Iterator<Item = usize>,
    op: &impl CustomOp1,
) -> Result<Tensor> {
    let (count, _) = logits.dims2()?;
    if let Some(row) = rows.find(|r| *r >= count) {
        return Err(bad_input(name, format!("row {row} of {count}")));
    }
    apply_where(logits, op)
}

/// `op`'s output over `logits`, left where the logits are: on the CPU over them in f32.
pub(crate) fn apply_where(logits: &Tensor, op: &impl CustomOp1) -> Result<Tensor> {
    let logits = match logits.device().is_cpu() {
        true => logits.to_dtype(DType::F32)?,
        false => logits.clone(),
    };
    logits.contiguous()?.apply_op1_no_bwd(op)
}

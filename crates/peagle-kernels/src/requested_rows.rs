//! What the ops over chosen rows of a step's logits share (`row_candidates`,
//! `gumbel_sample`): the requested rows checked, and the op applied where the logits are, to
//! f32 on the CPU (where it is the kernel's reference), its u32 words brought to the host.

use crate::error::bad_input;
use candle_core::{CustomOp1, DType, Result, Tensor};

/// `op`'s output words over `logits` ([rows, cols]), after checking that every one of `rows`,
/// the requests' rows, lies in it.
pub(crate) fn apply_to_rows(
    name: &'static str,
    logits: &Tensor,
    mut rows: impl Iterator<Item = usize>,
    op: &impl CustomOp1,
) -> Result<Vec<u32>> {
    let (count, _) = logits.dims2()?;
    if let Some(row) = rows.find(|r| *r >= count) {
        return Err(bad_input(name, format!("row {row} of {count}")));
    }
    apply_where(logits, op)?.flatten_all()?.to_vec1()
}

/// `op`'s output over `logits`, left where the logits are: on the CPU over them in f32.
pub(crate) fn apply_where(logits: &Tensor, op: &impl CustomOp1) -> Result<Tensor> {
    let logits = match logits.device().is_cpu() {
        true => logits.to_dtype(DType::F32)?,
        false => logits.clone(),
    };
    logits.contiguous()?.apply_op1_no_bwd(op)
}

//! Autoregressive drafting fed on the device: EAGLE-3's passes after the first read the last
//! pass's drafts as their tokens and its hidden outputs as their hidden input. Written there
//! by one launch (`kernels/gather_rows.cu`), the drafts never wait for the host between
//! passes. On the CPU the same values are made by host code, the kernel's reference.

use crate::error::bad_input;
use crate::indices::Indices;
use candle_core::{DType, Result, Tensor};

/// What the last drafter pass left, on its device.
#[derive(Clone, Copy)]
pub struct LastPass<'a> {
    /// u32 [kept rows]: each kept row's draft id, in the drafter's vocabulary.
    pub ids: &'a Tensor,
    /// [kept rows, cols]: each kept row's hidden output.
    pub hidden: &'a Tensor,
    /// u32 [draft vocabulary]: the target id of each draft id.
    pub to_target: &'a Tensor,
}

/// Row i of the next pass reads kept row `picks[i]` of `last`: its draft id, mapped to the
/// target's vocabulary, is written to `tokens[i]` (u32 [picks], contiguous: the next pass's
/// token ids) and its hidden output is row i of the returned hidden input, written into
/// `hidden_into` where given (contiguous [picks, cols] of the hidden outputs' dtype: a CUDA
/// graph's input). The first `drafts.len()` tokens, the last pass's drafts in order, are also
/// written to `drafts` (u32, contiguous). A draft id past the map becomes token 0. The outputs
/// must not share memory with the inputs: a row's token and hidden input are written while
/// other rows read.
pub fn chain_drafts(
    last: LastPass,
    picks: &Indices,
    tokens: &Tensor,
    drafts: &Tensor,
    hidden_into: Option<&Tensor>,
) -> Result<Tensor> {
    check(last, picks.values(), tokens, drafts, hidden_into)?;
    #[cfg(feature = "cuda")]
    if last.hidden.device().is_cuda() {
        let tensors = crate::cuda::ChainTensors {
            ids: last.ids,
            hidden: &last.hidden.contiguous()?,
            to_target: last.to_target,
            tokens,
            drafts,
        };
        return crate::cuda::chain_drafts(&tensors, picks, hidden_into);
    }
    crate::pick_ids(last.ids, picks, Some(last.to_target), Some(tokens))?;
    crate::pick_ids(
        last.ids,
        &picks.first(drafts.dim(0)?)?,
        Some(last.to_target),
        Some(drafts),
    )?;
    match hidden_into {
        Some(into) => {
            crate::gather_rows_into(into, last.hidden, None, picks)?;
            Ok(into.clone())
        }
        None => crate::gather_rows(last.hidden, None, picks),
    }
}

fn check(last: LastPass, picks: &[u32], tokens: &Tensor, drafts: &Tensor, hidden_into: Option<&Tensor>) -> Result<()> {
    const OP: &str = "chain_drafts";
    let (kept, cols) = last.hidden.dims2()?;
    let u32s = [last.ids, last.to_target, tokens, drafts];
    if u32s
        .iter()
        .any(|t| t.dtype() != DType::U32 || t.rank() != 1 || !t.is_contiguous())
    {
        return Err(bad_input(
            OP,
            "ids, map, tokens and drafts must be contiguous u32 vectors",
        ));
    }
    let device = last.hidden.device();
    let mut all = u32s.iter().copied().chain(hidden_into);
    if !all.all(|t| t.device().same_device(device)) {
        return Err(bad_input(OP, "every tensor must be on the hidden outputs' device"));
    }
    if last.ids.dim(0)? != kept {
        return Err(bad_input(
            OP,
            format!("{} ids for {kept} hidden outputs", last.ids.dim(0)?),
        ));
    }
    if let Some(bad) = picks.iter().find(|&&p| p as usize >= kept) {
        return Err(bad_input(OP, format!("row {bad} of {kept} kept rows")));
    }
    if picks.is_empty() {
        return Err(bad_input(OP, "a pass needs rows"));
    }
    if tokens.dim(0)? != picks.len() || drafts.dim(0)? > picks.len() {
        return Err(bad_input(
            OP,
            format!(
                "{} picks for {} tokens and {} drafts",
                picks.len(),
                tokens.dim(0)?,
                drafts.dim(0)?
            ),
        ));
    }
    if let Some(into) = hidden_into {
        if into.dims() != [picks.len(), cols] || into.dtype() != last.hidden.dtype() || !into.is_contiguous() {
            return Err(bad_input(
                OP,
                format!(
                    "a hidden input of {:?} {:?} for {} picks",
                    into.dtype(),
                    into.dims(),
                    picks.len()
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_next_pass_reads_the_picked_rows_drafts_as_target_ids() {
        let dev = Device::Cpu;
        let ids = Tensor::new(&[2u32, 0, 9], &dev).unwrap();
        let hidden = Tensor::new(&[[1f32, 2.], [3., 4.], [5., 6.]], &dev).unwrap();
        let to_target = Tensor::new(&[10u32, 11, 12], &dev).unwrap();
        let last = LastPass {
            ids: &ids,
            hidden: &hidden,
            to_target: &to_target,
        };
        // The tokens are a view of a larger input, as a forward's ids are.
        let inputs = Tensor::zeros(6, DType::U32, &dev).unwrap();
        let tokens = inputs.narrow(0, 0, 4).unwrap();
        let drafts = Tensor::zeros(2, DType::U32, &dev).unwrap();
        let got = chain_drafts(last, &Indices::new(&[1, 0, 2, 1]), &tokens, &drafts, None).unwrap();
        assert_eq!(got.to_vec2::<f32>().unwrap(), [[3., 4.], [1., 2.], [5., 6.], [3., 4.]]);
        // Id 9 is past the map: token 0.
        assert_eq!(inputs.to_vec1::<u32>().unwrap(), [10, 12, 0, 10, 0, 0]);
        assert_eq!(drafts.to_vec1::<u32>().unwrap(), [10, 12]);

        let into = Tensor::zeros((1, 2), DType::F32, &dev).unwrap();
        chain_drafts(
            last,
            &Indices::new(&[2]),
            &inputs.narrow(0, 5, 1).unwrap(),
            &drafts.narrow(0, 0, 0).unwrap(),
            Some(&into),
        )
        .unwrap();
        assert_eq!(into.to_vec2::<f32>().unwrap(), [[5., 6.]]);

        let refused = |picks: &[u32], tokens: &Tensor, drafts: &Tensor| {
            chain_drafts(last, &Indices::new(picks), tokens, drafts, None).is_err()
        };
        assert!(
            refused(&[3], &tokens.narrow(0, 0, 1).unwrap(), &drafts),
            "a row past the kept rows"
        );
        assert!(refused(&[0, 1], &tokens, &drafts), "fewer picks than tokens");
        assert!(
            refused(&[0], &tokens.narrow(0, 0, 1).unwrap(), &drafts),
            "more drafts than picks"
        );
        assert!(
            refused(&[], &tokens.narrow(0, 0, 0).unwrap(), &drafts.narrow(0, 0, 0).unwrap()),
            "no picks"
        );
        let floats = Tensor::zeros(4, DType::F32, &dev).unwrap();
        assert!(refused(&[0, 1, 2, 0], &floats, &drafts), "tokens of another dtype");
    }
}

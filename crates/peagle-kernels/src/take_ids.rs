//! Token ids taken where they lie on the device: a proposer's drafts, mapped to the target's
//! vocabulary and then written into the next verification window's token inputs, never cross
//! to the host before the target reads them. The host reads them once, while the target runs.
//! On a GPU it is one upload of the indices and one launch (`kernels/gather_rows.cu`); on the
//! CPU the same values are made by host code, the kernel's reference.

use crate::error::bad_input;
use candle_core::{DType, Result, Tensor};

/// Writes `out[at[j]] = map[ids[picks[j]]]` for each j, or `ids[picks[j]]` where `map` is
/// None; every other element of `out` is left as it was. `out`, `ids` and `map` are contiguous
/// u32 vectors on one device, every `at` is within `out` and no two are equal, and every pick
/// is within `ids`. An id past the map becomes 0 (an argmax gives none). `out` must not share
/// memory with `ids` or `map`.
pub fn take_ids(out: &Tensor, at: &[u32], ids: &Tensor, picks: &[u32], map: Option<&Tensor>) -> Result<()> {
    check(out, at, ids, picks, map)?;
    if at.is_empty() {
        return Ok(());
    }
    #[cfg(feature = "cuda")]
    if out.device().is_cuda() {
        return crate::cuda::take_ids(out, at, ids, picks, map);
    }
    let ids: Vec<u32> = ids.to_vec1()?;
    let map: Option<Vec<u32>> = map.map(Tensor::to_vec1).transpose()?;
    let mut values: Vec<u32> = out.to_vec1()?;
    for (&to, &pick) in at.iter().zip(picks) {
        let id = ids[pick as usize];
        values[to as usize] = match &map {
            Some(map) => map.get(id as usize).copied().unwrap_or(0),
            None => id,
        };
    }
    crate::upload_into(out, &values)
}

fn check(out: &Tensor, at: &[u32], ids: &Tensor, picks: &[u32], map: Option<&Tensor>) -> Result<()> {
    const OP: &str = "take_ids";
    let tensors = [Some(out), Some(ids), map];
    let mut all = tensors.iter().flatten();
    if !all.all(|t| t.dtype() == DType::U32 && t.rank() == 1 && t.is_contiguous()) {
        return Err(bad_input(OP, "out, ids and map must be contiguous u32 vectors"));
    }
    if !tensors.iter().flatten().all(|t| t.device().same_device(out.device())) {
        return Err(bad_input(OP, "ids and map must be on out's device"));
    }
    if at.len() != picks.len() {
        return Err(bad_input(OP, format!("{} places for {} picks", at.len(), picks.len())));
    }
    let (len, kept) = (out.dim(0)?, ids.dim(0)?);
    if let Some(bad) = picks.iter().find(|&&p| p as usize >= kept) {
        return Err(bad_input(OP, format!("pick {bad} of {kept} ids")));
    }
    let mut taken = vec![false; len];
    for &to in at {
        match taken.get_mut(to as usize) {
            None => return Err(bad_input(OP, format!("place {to} of {len}"))),
            Some(true) => return Err(bad_input(OP, format!("place {to} taken twice"))),
            Some(free) => *free = true,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn ids_land_where_asked_mapped_or_not() {
        let dev = Device::Cpu;
        let ids = Tensor::new(&[4u32, 1, 9], &dev).unwrap();
        let map = Tensor::new(&[10u32, 11, 12, 13, 14], &dev).unwrap();
        // The output is a view of a larger input, as a forward's ids are.
        let inputs = Tensor::full(7u32, 6, &dev).unwrap();
        let out = inputs.narrow(0, 1, 4).unwrap();
        take_ids(&out, &[3, 0, 2], &ids, &[0, 2, 1], Some(&map)).unwrap();
        // Id 9 is past the map: 0.
        assert_eq!(inputs.to_vec1::<u32>().unwrap(), [7, 0, 7, 11, 14, 7]);
        take_ids(&out, &[1], &ids, &[2], None).unwrap();
        assert_eq!(inputs.to_vec1::<u32>().unwrap(), [7, 0, 9, 11, 14, 7]);

        let refused = |at: &[u32], picks: &[u32]| take_ids(&out, at, &ids, picks, None).is_err();
        assert!(refused(&[4], &[0]), "a place past out");
        assert!(refused(&[0], &[3]), "a pick past ids");
        assert!(refused(&[1, 1], &[0, 1]), "one place twice");
        assert!(refused(&[0, 1], &[0]), "more places than picks");
        let floats = Tensor::zeros(3, DType::F32, &dev).unwrap();
        assert!(
            take_ids(&out, &[0], &floats, &[0], None).is_err(),
            "ids of another dtype"
        );
    }
}

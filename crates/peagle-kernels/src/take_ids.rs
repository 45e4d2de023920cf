//! Token ids taken where they lie on the device: a proposer's drafts, mapped to the target's
//! vocabulary and then written into the next verification window's token inputs, never cross
//! to the host before the target reads them. The host reads them once, while the target runs.
//! On a GPU it is one launch (`kernels/gather_rows.cu`), with an upload of the indices unless
//! they came with the forward's inputs (`Indices`); on the CPU the same values are made by host
//! code, the kernel's reference.

use crate::error::bad_input;
use crate::indices::Indices;
use candle_core::{DType, Device, Result, Tensor};

/// Writes `out[at[j]] = map[ids[picks[j]]]` for each j, or `ids[picks[j]]` where `map` is
/// None; every other element of `out` is left as it was. `out`, `ids` and `map` are contiguous
/// u32 vectors on one device, every `at` is within `out` and no two are equal, and every pick
/// is within `ids`. An id past the map becomes 0 (an argmax gives none). `out` must not share
/// memory with `ids` or `map`.
pub fn take_ids(out: &Tensor, at: &Indices, ids: &Tensor, picks: &Indices, map: Option<&Tensor>) -> Result<()> {
    check(out, Some(at.values()), ids, picks.values(), map)?;
    write(out, Some(at), ids, picks, map)
}

/// `take_ids` into every element of `into` in order (u32 [picks], contiguous), or of a new
/// tensor, which is returned: element j is `map[ids[picks[j]]]`, or `ids[picks[j]]`.
pub fn pick_ids(ids: &Tensor, picks: &Indices, map: Option<&Tensor>, into: Option<&Tensor>) -> Result<Tensor> {
    let out = match into {
        Some(out) => out.clone(),
        None => ids_to_write(picks.len(), ids.device())?,
    };
    check(&out, None, ids, picks.values(), map)?;
    write(&out, None, ids, picks, map)?;
    Ok(out)
}

/// A u32 vector of `len` on `device` for kernels to write whole before anything reads it (a
/// `pick_ids` output, a step's drafts): on a GPU its values are whatever the memory held, with
/// no fill, which would be a launch of its own; on the CPU zeros.
pub fn ids_to_write(len: usize, device: &Device) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if device.is_cuda() && len > 0 {
        return crate::cuda::uninitialized_u32(device, len);
    }
    Tensor::zeros(len, DType::U32, &Device::Cpu)?.to_device(device)
}

/// Writes the ids into `out` (checked), at places `at`, or in order without them.
fn write(out: &Tensor, at: Option<&Indices>, ids: &Tensor, picks: &Indices, map: Option<&Tensor>) -> Result<()> {
    if picks.is_empty() {
        return Ok(());
    }
    #[cfg(feature = "cuda")]
    if out.device().is_cuda() {
        return crate::cuda::take_ids(out, at, ids, picks, map);
    }
    let ids: Vec<u32> = ids.to_vec1()?;
    let map: Option<Vec<u32>> = map.map(Tensor::to_vec1).transpose()?;
    let mut values: Vec<u32> = out.to_vec1()?;
    for (j, &pick) in picks.values().iter().enumerate() {
        let id = ids[pick as usize];
        let place = at.map_or(j, |at| at.values()[j] as usize);
        values[place] = match &map {
            Some(map) => map.get(id as usize).copied().unwrap_or(0),
            None => id,
        };
    }
    crate::upload_into(out, &values)
}

/// Checks the tensors and the indices; without places `at`, `out` holds one id a pick.
fn check(out: &Tensor, at: Option<&[u32]>, ids: &Tensor, picks: &[u32], map: Option<&Tensor>) -> Result<()> {
    const OP: &str = "take_ids";
    let tensors = [Some(out), Some(ids), map];
    let mut all = tensors.iter().flatten();
    if !all.all(|t| t.dtype() == DType::U32 && t.rank() == 1 && t.is_contiguous()) {
        return Err(bad_input(OP, "out, ids and map must be contiguous u32 vectors"));
    }
    if !tensors.iter().flatten().all(|t| t.device().same_device(out.device())) {
        return Err(bad_input(OP, "ids and map must be on out's device"));
    }
    let (len, kept) = (out.dim(0)?, ids.dim(0)?);
    if let Some(bad) = picks.iter().find(|&&p| p as usize >= kept) {
        return Err(bad_input(OP, format!("pick {bad} of {kept} ids")));
    }
    let Some(at) = at else {
        return match picks.len() == len {
            true => Ok(()),
            false => Err(bad_input(OP, format!("{} picks for {len} ids", picks.len()))),
        };
    };
    if at.len() != picks.len() {
        return Err(bad_input(OP, format!("{} places for {} picks", at.len(), picks.len())));
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

    fn take(out: &Tensor, at: &[u32], ids: &Tensor, picks: &[u32], map: Option<&Tensor>) -> Result<()> {
        take_ids(out, &Indices::new(at), ids, &Indices::new(picks), map)
    }

    #[test]
    fn ids_land_where_asked_mapped_or_not() {
        let dev = Device::Cpu;
        let ids = Tensor::new(&[4u32, 1, 9], &dev).unwrap();
        let map = Tensor::new(&[10u32, 11, 12, 13, 14], &dev).unwrap();
        // The output is a view of a larger input, as a forward's ids are.
        let inputs = Tensor::full(7u32, 6, &dev).unwrap();
        let out = inputs.narrow(0, 1, 4).unwrap();
        take(&out, &[3, 0, 2], &ids, &[0, 2, 1], Some(&map)).unwrap();
        // Id 9 is past the map: 0.
        assert_eq!(inputs.to_vec1::<u32>().unwrap(), [7, 0, 7, 11, 14, 7]);
        take(&out, &[1], &ids, &[2], None).unwrap();
        assert_eq!(inputs.to_vec1::<u32>().unwrap(), [7, 0, 9, 11, 14, 7]);

        let refused = |at: &[u32], picks: &[u32]| take(&out, at, &ids, picks, None).is_err();
        assert!(refused(&[4], &[0]), "a place past out");
        assert!(refused(&[0], &[3]), "a pick past ids");
        assert!(refused(&[1, 1], &[0, 1]), "one place twice");
        assert!(refused(&[0, 1], &[0]), "more places than picks");
        let floats = Tensor::zeros(3, DType::F32, &dev).unwrap();
        assert!(take(&out, &[0], &floats, &[0], None).is_err(), "ids of another dtype");
    }

    #[test]
    fn picked_ids_fill_a_new_tensor_or_one_given_whole() {
        let dev = Device::Cpu;
        let ids = Tensor::new(&[4u32, 1, 9], &dev).unwrap();
        let map = Tensor::new(&[10u32, 11, 12, 13, 14], &dev).unwrap();
        let got = pick_ids(&ids, &Indices::new(&[2, 0, 1, 0]), Some(&map), None).unwrap();
        assert_eq!(got.to_vec1::<u32>().unwrap(), [0, 14, 11, 14]);
        let empty = pick_ids(&ids, &Indices::new(&[]), None, None).unwrap();
        assert_eq!(empty.dims(), [0]);

        let inputs = Tensor::full(7u32, 4, &dev).unwrap();
        let into = inputs.narrow(0, 1, 2).unwrap();
        pick_ids(&ids, &Indices::new(&[1, 2]), None, Some(&into)).unwrap();
        assert_eq!(inputs.to_vec1::<u32>().unwrap(), [7, 1, 9, 7]);
        let refused = |picks: &[u32]| pick_ids(&ids, &Indices::new(picks), None, Some(&into)).is_err();
        assert!(refused(&[1]), "fewer picks than the tensor holds");
        assert!(refused(&[0, 3]), "a pick past ids");
    }
}

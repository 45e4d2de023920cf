//! Indices a kernel reads (rows to gather, places to write), as the host knows them: it checks
//! them, and on the CPU computes with them. A launch on a GPU uploads them, unless the caller
//! has already: a forward's inputs carry the indices of the kernels issued beside it in their
//! own upload (`ForwardInputs` in peagle-models), so those launches add no copy of their own to
//! a step. Each kernel that reads indices skips one past its tensors, so a device copy that
//! disagreed with the host's values could not make it read or write out of bounds.

use crate::error::bad_input;
use candle_core::{DType, Result, Tensor};

#[derive(Debug, Clone)]
pub struct Indices<'a> {
    values: &'a [u32],
    /// `values` on the device, where the caller uploaded them: a contiguous u32 vector.
    uploaded: Option<Tensor>,
}

impl<'a> Indices<'a> {
    /// Indices on the host alone: a launch on a GPU uploads them.
    pub fn new(values: &'a [u32]) -> Self {
        Self { values, uploaded: None }
    }

    /// `values`, which `on_device`, a contiguous u32 vector of as many elements, holds on the
    /// device: what the caller uploaded them into. The launch reads it without checking it
    /// holds `values`; the caller answers for that.
    pub fn uploaded(values: &'a [u32], on_device: Tensor) -> Result<Self> {
        if on_device.dtype() != DType::U32 || on_device.dims() != [values.len()] || !on_device.is_contiguous() {
            return Err(bad_input(
                "indices",
                format!(
                    "{} indices uploaded as a {:?} tensor of {:?}",
                    values.len(),
                    on_device.dtype(),
                    on_device.dims()
                ),
            ));
        }
        Ok(Self {
            values,
            uploaded: Some(on_device),
        })
    }

    pub fn values(&self) -> &'a [u32] {
        self.values
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The first `len` indices.
    pub fn first(&self, len: usize) -> Result<Self> {
        if len > self.values.len() {
            return Err(bad_input(
                "indices",
                format!("the first {len} of {} indices", self.values.len()),
            ));
        }
        let uploaded = self.uploaded.as_ref().map(|t| t.narrow(0, 0, len)).transpose()?;
        Ok(Self {
            values: &self.values[..len],
            uploaded,
        })
    }

    /// Each set's indices on `device`, as contiguous u32 vectors: those uploaded where they
    /// are, the rest in one upload together.
    #[cfg(feature = "cuda")]
    pub(crate) fn on_device<const N: usize>(sets: [&Indices; N], device: &candle_core::Device) -> Result<[Tensor; N]> {
        let missing: Vec<u32> = sets
            .iter()
            .filter(|set| set.uploaded.is_none())
            .flat_map(|set| set.values.iter().copied())
            .collect();
        // With nothing to upload, a set on the host is empty: a view of no elements of one
        // uploaded serves it, and no copy is issued.
        let fresh = match (missing.is_empty(), sets.iter().find_map(|set| set.uploaded.as_ref())) {
            (true, Some(uploaded)) => uploaded.narrow(0, 0, 0)?,
            // Through the host's tensor, so that no indices at all make no device allocation
            // (CUDA refuses one of no bytes), as `no_rows` does.
            _ => {
                let count = missing.len();
                Tensor::from_vec(missing, count, &candle_core::Device::Cpu)?.to_device(device)?
            }
        };
        let mut at = 0;
        let mut out = Vec::with_capacity(N);
        for set in sets {
            match &set.uploaded {
                Some(tensor) => out.push(tensor.clone()),
                None => {
                    out.push(fresh.narrow(0, at, set.len())?);
                    at += set.len();
                }
            }
        }
        Ok(out.try_into().expect("one tensor a set"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn an_upload_must_hold_as_many_u32s_and_the_first_ones_narrow_it() {
        let dev = Device::Cpu;
        let values = [3u32, 1, 4];
        let upload = Tensor::new(&[9u32, 3, 1, 4], &dev).unwrap();
        let indices = Indices::uploaded(&values, upload.narrow(0, 1, 3).unwrap()).unwrap();
        let first = indices.first(2).unwrap();
        assert_eq!(first.values(), [3, 1]);
        let on_device = first.uploaded.as_ref().expect("still uploaded");
        assert_eq!(on_device.to_vec1::<u32>().unwrap(), [3, 1]);
        assert!(indices.first(4).is_err(), "more than there are");

        assert!(Indices::uploaded(&values, upload.clone()).is_err(), "four for three");
        let floats = Tensor::new(&[3f32, 1., 4.], &dev).unwrap();
        assert!(Indices::uploaded(&values, floats).is_err(), "another dtype");
        let strided = Tensor::new(&[[3u32, 0], [1, 0], [4, 0]], &dev).unwrap();
        let column = strided.narrow(1, 0, 1).unwrap().squeeze(1).unwrap();
        assert!(Indices::uploaded(&values, column).is_err(), "not contiguous");
    }
}

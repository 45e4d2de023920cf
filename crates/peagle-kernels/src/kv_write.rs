//! Scatter of new key or value rows into a paged cache.

use crate::cache_element::CacheElement;
use crate::contiguous::{strided_rows, StridedRows};
use crate::error::bad_input;
use crate::paged_attention::AttentionMetadata;
use candle_core::{CpuStorage, InplaceOp2, Layout, Result, Tensor};

/// The slot of a row whose keys and values are not kept: a row that pads a batch to a fixed
/// shape (a CUDA graph's), which `write_kv` skips.
pub const PAD_SLOT: u32 = u32::MAX;

/// Checks that every slot is in a cache of `num_slots` or is `PAD_SLOT`.
pub(crate) fn check_slots(op: &'static str, slots: &[u32], num_slots: usize) -> Result<()> {
    match slots.iter().find(|&&s| s != PAD_SLOT && s as usize >= num_slots) {
        Some(bad) => Err(bad_input(op, format!("slot {bad} outside a cache of {num_slots}"))),
        None => Ok(()),
    }
}

/// Writes row `t` of `new` [tokens, width] (f32; f32 or bf16 on CUDA; its rows may be strided,
/// as a column range of a fused projection's output), divided by `scale`,
/// into row `meta.slot_mapping[t]` of `cache` [num_slots, width] (none for `PAD_SLOT`) (f32, or bf16 or f8e4m3
/// rounded to nearest even, f8e4m3 saturated at ±448); on a GPU, from the slots' device copy
/// (`AttentionMetadata::on_device`). `scale` is the cache's per-tensor scale (see `KvScale`),
/// 1 for f32 and bf16. Rows of rejected speculative tokens are simply overwritten by a later
/// call.
pub fn write_kv(cache: &Tensor, new: &Tensor, meta: &AttentionMetadata, scale: f32) -> Result<()> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(bad_input(
            "write_kv",
            format!("the cache's scale {scale} is not a positive number"),
        ));
    }
    let op = WriteKv {
        slots: &meta.slot_mapping,
        on_device: meta.device.as_ref().map(|d| &d.slots),
        scale,
    };
    cache.inplace_op2(new, &op)
}

struct WriteKv<'a> {
    slots: &'a [u32],
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    on_device: Option<&'a Tensor>,
    scale: f32,
}

impl InplaceOp2 for WriteKv<'_> {
    fn name(&self) -> &'static str {
        "peagle-write-kv"
    }

    fn cpu_fwd(&self, dst: &mut CpuStorage, dst_l: &Layout, src: &CpuStorage, src_l: &Layout) -> Result<()> {
        self.check(dst_l, src_l)?;
        let rows = strided_rows(src_l, "write_kv", "the new rows")?;
        let src = (src.as_slice::<f32>()?, &rows);
        let (start, _) = dst_l
            .contiguous_offsets()
            .ok_or_else(|| bad_input("write_kv", "cache must be contiguous"))?;
        match dst {
            CpuStorage::F32(d) => self.scatter(&mut d[start..], src),
            CpuStorage::BF16(d) => self.scatter(&mut d[start..], src),
            CpuStorage::F8E4M3(d) => self.scatter(&mut d[start..], src),
            _ => return Err(bad_input("write_kv", "cache must be f32, bf16 or f8e4m3")),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dst_l: &Layout,
        src: &candle_core::CudaStorage,
        src_l: &Layout,
    ) -> Result<()> {
        let width = self.check(dst_l, src_l)?;
        let slots = self.on_device.ok_or_else(|| {
            bad_input(
                "write_kv",
                "the slots have no device copy: AttentionMetadata::on_device",
            )
        })?;
        crate::cuda::kv_write(dst, dst_l, src, src_l, slots, width, self.scale)
    }
}

impl WriteKv<'_> {
    /// Checks the rows against the cache and every slot against its size; returns the width.
    fn check(&self, dst_l: &Layout, src_l: &Layout) -> Result<usize> {
        let (num_slots, width) = dst_l.shape().dims2()?;
        let (tokens, src_width) = src_l.shape().dims2()?;
        if width != src_width || tokens != self.slots.len() {
            return Err(bad_input(
                "write_kv",
                format!(
                    "cache rows are {width} wide, new rows {src_width} wide, {tokens} rows for {} slots",
                    self.slots.len()
                ),
            ));
        }
        check_slots("write_kv", self.slots, num_slots)?;
        Ok(width)
    }

    /// Row t of `src` (the storage and where its rows lie) into row `slots[t]` of `dst`.
    fn scatter<T: CacheElement>(&self, dst: &mut [T], (src, rows): (&[f32], &StridedRows)) {
        let width = rows.width;
        for (t, slot) in self.slots.iter().enumerate() {
            if *slot == PAD_SLOT {
                continue;
            }
            for (d, s) in dst[*slot as usize * width..][..width].iter_mut().zip(rows.row(src, t)) {
                *d = T::from_f32(*s / self.scale);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// Rows read in place from a column range of a wider tensor (a fused projection's values)
    /// land as the same rows copied out first would; a padding row writes nothing; a row
    /// whose elements are strided is refused.
    #[test]
    fn strided_rows_are_written_as_contiguous_ones() {
        let wide = Tensor::arange(0f32, 4.0 * 10.0, &Device::Cpu)
            .unwrap()
            .reshape((4, 10))
            .unwrap();
        let columns = wide.narrow(1, 3, 5).unwrap();
        let meta = AttentionMetadata {
            slot_mapping: vec![2, PAD_SLOT, 0, 5],
            ..Default::default()
        };
        for dtype in [DType::F32, DType::BF16, DType::F8E4M3] {
            let strided = Tensor::zeros((6, 5), dtype, &Device::Cpu).unwrap();
            write_kv(&strided, &columns, &meta, 2.0).unwrap();
            let copied = Tensor::zeros((6, 5), dtype, &Device::Cpu).unwrap();
            write_kv(&copied, &columns.contiguous().unwrap(), &meta, 2.0).unwrap();
            let values = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(values(&strided), values(&copied), "{dtype:?}");
            assert_eq!(
                values(&strided)[2],
                [1.5, 2.0, 2.5, 3.0, 3.5],
                "{dtype:?}: row 0 at slot 2"
            );
            assert_eq!(values(&strided)[1], [0.0; 5], "{dtype:?}: nothing written");
        }
        let cache = Tensor::zeros((6, 4), DType::F32, &Device::Cpu).unwrap();
        let transposed = Tensor::zeros((4, 4), DType::F32, &Device::Cpu).unwrap().t().unwrap();
        let err = write_kv(&cache, &transposed, &meta, 1.0).unwrap_err();
        assert!(err.to_string().contains("must be contiguous"), "{err}");
    }
}

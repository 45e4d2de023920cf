//! Scatter of a batch's new keys and values into a layer's paged cache, both in one op (one
//! launch on a GPU: a decode step writes a row of each per layer, and each launch costs more
//! than the row).

use crate::attention_metadata::AttentionMetadata;
use crate::cache_element::CacheElement;
use crate::contiguous::{strided_rows, StridedRows};
use crate::error::bad_input;
use crate::paged_attention::KvScale;
use crate::rope::Rotation;
use candle_core::{CpuStorage, InplaceOp3, Layout, Result, Tensor};

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

/// Writes row `t` of the keys `k` and of the values `v` [tokens, width] (f32; f32 or bf16 on
/// CUDA, both the same; their rows may be strided, as column ranges of a fused projection's
/// output), divided by `scale.k` and `scale.v`, into slot `meta.slot_mapping[t]` of `cache`
/// [2, num_slots, width]: the keys into `cache[0]`, the values into `cache[1]` (none for
/// `PAD_SLOT`). The cache is f32, or bf16 or f8e4m3 rounded to nearest even, f8e4m3 saturated
/// at ±448; on a GPU the slots are read from their device copy (`AttentionMetadata::on_device`).
/// The scales are the cache's per-tensor ones (see `KvScale`), 1 for f32 and bf16. Rows of
/// rejected speculative tokens are simply overwritten by a later call.
pub fn write_kv(cache: &Tensor, k: &Tensor, v: &Tensor, meta: &AttentionMetadata, scale: KvScale) -> Result<()> {
    write(cache, k, v, meta, scale, None)
}

/// `write_kv` of the keys `k` rotated by `rotation` (as `Rotation::apply` rotates them) and of
/// the values `v`: on a GPU the one launch rotates the keys as it reads them.
pub fn write_rotated_kv(
    cache: &Tensor,
    k: &Tensor,
    v: &Tensor,
    meta: &AttentionMetadata,
    scale: KvScale,
    rotation: Rotation,
) -> Result<()> {
    match cache.device().is_cpu() {
        true => write(cache, &rotation.apply(k)?, v, meta, scale, None),
        false => write(cache, k, v, meta, scale, Some(rotation)),
    }
}

fn write(
    cache: &Tensor,
    k: &Tensor,
    v: &Tensor,
    meta: &AttentionMetadata,
    scale: KvScale,
    rotation: Option<Rotation>,
) -> Result<()> {
    if let Some(bad) = [scale.k, scale.v].into_iter().find(|s| !(s.is_finite() && *s > 0.0)) {
        return Err(bad_input(
            "write_kv",
            format!("the cache's scale {bad} is not a positive number"),
        ));
    }
    if k.dtype() != v.dtype() {
        return Err(bad_input(
            "write_kv",
            format!("keys in {:?} with values in {:?}", k.dtype(), v.dtype()),
        ));
    }
    let op = WriteKv {
        slots: &meta.slot_mapping,
        on_device: meta.device.as_ref().map(|d| &d.slots),
        scale,
        rotation,
    };
    cache.inplace_op3(k, v, &op)
}

struct WriteKv<'a> {
    slots: &'a [u32],
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    on_device: Option<&'a Tensor>,
    scale: KvScale,
    /// The keys' rotation, which only the GPU's kernel applies (`write_rotated_kv`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    rotation: Option<Rotation<'a>>,
}

impl InplaceOp3 for WriteKv<'_> {
    fn name(&self) -> &'static str {
        "peagle-write-kv"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<()> {
        let (num_slots, width) = self.check(dst_l, k_l, v_l)?;
        let k = (k.as_slice::<f32>()?, &strided_rows(k_l, "write_kv", "the keys")?);
        let v = (v.as_slice::<f32>()?, &strided_rows(v_l, "write_kv", "the values")?);
        let (start, _) = dst_l
            .contiguous_offsets()
            .ok_or_else(|| bad_input("write_kv", "cache must be contiguous"))?;
        let half = num_slots * width;
        match dst {
            CpuStorage::F32(d) => self.scatter_both(&mut d[start..][..2 * half], k, v),
            CpuStorage::BF16(d) => self.scatter_both(&mut d[start..][..2 * half], k, v),
            CpuStorage::F8E4M3(d) => self.scatter_both(&mut d[start..][..2 * half], k, v),
            _ => return Err(bad_input("write_kv", "cache must be f32, bf16 or f8e4m3")),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dst_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> Result<()> {
        let (num_slots, width) = self.check(dst_l, k_l, v_l)?;
        let slots = self.on_device.ok_or_else(|| {
            bad_input(
                "write_kv",
                "the slots have no device copy: AttentionMetadata::on_device",
            )
        })?;
        let rotation = self
            .rotation
            .map(|r| r.checked("write_kv", self.slots.len(), width))
            .transpose()?;
        let new = crate::cuda::NewRows {
            k: (k, k_l),
            v: (v, v_l),
            scale: self.scale,
            rotation,
        };
        crate::cuda::kv_write(dst, dst_l, &new, slots, num_slots, width)
    }
}

/// A source of rows: its storage's elements and where its rows lie.
type Rows<'a> = (&'a [f32], &'a StridedRows);

impl WriteKv<'_> {
    /// Checks the keys and values against the cache and every slot against its size; returns
    /// the cache's slots and width.
    fn check(&self, dst_l: &Layout, k_l: &Layout, v_l: &Layout) -> Result<(usize, usize)> {
        let (pair, num_slots, width) = dst_l.shape().dims3()?;
        if pair != 2 {
            return Err(bad_input(
                "write_kv",
                format!("the cache holds keys and values, [2, slots, width], not {pair} tensors"),
            ));
        }
        for (what, l) in [("keys", k_l), ("values", v_l)] {
            let (tokens, src_width) = l.shape().dims2()?;
            if width != src_width || tokens != self.slots.len() {
                return Err(bad_input(
                    "write_kv",
                    format!(
                        "cache rows are {width} wide, new {what} {src_width} wide, {tokens} rows for {} slots",
                        self.slots.len()
                    ),
                ));
            }
        }
        check_slots("write_kv", self.slots, num_slots)?;
        Ok((num_slots, width))
    }

    /// The keys into the first half of `dst`, the values into the second.
    fn scatter_both<T: CacheElement>(&self, dst: &mut [T], k: Rows, v: Rows) {
        let (keys, values) = dst.split_at_mut(dst.len() / 2);
        self.scatter(keys, k, self.scale.k);
        self.scatter(values, v, self.scale.v);
    }

    /// Row t of `src` into row `slots[t]` of `dst`, divided by `scale`.
    fn scatter<T: CacheElement>(&self, dst: &mut [T], (src, rows): Rows, scale: f32) {
        let width = rows.width;
        for (t, slot) in self.slots.iter().enumerate() {
            if *slot == PAD_SLOT {
                continue;
            }
            for (d, s) in dst[*slot as usize * width..][..width].iter_mut().zip(rows.row(src, t)) {
                *d = T::from_f32(*s / scale);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    /// Rows read in place from column ranges of a wider tensor (a fused projection's keys and
    /// values) land as the same rows copied out first would, each in its half of the cache
    /// with its own scale; a padding row writes nothing; a row whose elements are strided is
    /// refused.
    #[test]
    fn strided_rows_are_written_as_contiguous_ones() {
        let wide = Tensor::arange(0f32, 4.0 * 10.0, &Device::Cpu)
            .unwrap()
            .reshape((4, 10))
            .unwrap();
        let (k, v) = (wide.narrow(1, 0, 5).unwrap(), wide.narrow(1, 5, 5).unwrap());
        let meta = AttentionMetadata {
            slot_mapping: vec![2, PAD_SLOT, 0, 5],
            ..Default::default()
        };
        let scale = KvScale { k: 2.0, v: 0.5 };
        for dtype in [DType::F32, DType::BF16, DType::F8E4M3] {
            let strided = Tensor::zeros((2, 6, 5), dtype, &Device::Cpu).unwrap();
            write_kv(&strided, &k, &v, &meta, scale).unwrap();
            let copied = Tensor::zeros((2, 6, 5), dtype, &Device::Cpu).unwrap();
            let contiguous = |t: &Tensor| t.contiguous().unwrap();
            write_kv(&copied, &contiguous(&k), &contiguous(&v), &meta, scale).unwrap();
            let values = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec3::<f32>().unwrap();
            assert_eq!(values(&strided), values(&copied), "{dtype:?}");
            let stored = values(&strided);
            assert_eq!(
                stored[0][2],
                [0.0, 0.5, 1.0, 1.5, 2.0],
                "{dtype:?}: keys of row 0 at slot 2"
            );
            assert_eq!(stored[1][2], [10.0, 12.0, 14.0, 16.0, 18.0], "{dtype:?}: its values");
            assert_eq!(stored[0][1], [0.0; 5], "{dtype:?}: nothing written");
            assert_eq!(stored[1][1], [0.0; 5], "{dtype:?}: nothing written");
        }
        let cache = Tensor::zeros((2, 6, 4), DType::F32, &Device::Cpu).unwrap();
        let transposed = Tensor::zeros((4, 4), DType::F32, &Device::Cpu).unwrap().t().unwrap();
        let rows = Tensor::zeros((4, 4), DType::F32, &Device::Cpu).unwrap();
        let err = write_kv(&cache, &rows, &transposed, &meta, KvScale::ONE).unwrap_err();
        assert!(err.to_string().contains("must be contiguous"), "{err}");
    }

    /// A cache that is not [2, slots, width], keys and values of other widths or dtypes, and
    /// scales that are not positive numbers are refused.
    #[test]
    fn misshapen_inputs_are_refused() {
        let dev = Device::Cpu;
        let meta = AttentionMetadata {
            slot_mapping: vec![0, 1],
            ..Default::default()
        };
        let rows = Tensor::zeros((2, 4), DType::F32, &dev).unwrap();
        let error = |cache: &Tensor, k: &Tensor, v: &Tensor, scale| {
            write_kv(cache, k, v, &meta, scale).unwrap_err().to_string()
        };
        let cache = Tensor::zeros((2, 3, 4), DType::F32, &dev).unwrap();
        let one = Tensor::zeros((3, 4), DType::F32, &dev).unwrap();
        assert!(error(&one, &rows, &rows, KvScale::ONE).contains("rank"));
        let three = Tensor::zeros((3, 3, 4), DType::F32, &dev).unwrap();
        assert!(error(&three, &rows, &rows, KvScale::ONE).contains("not 3 tensors"));
        let narrow = Tensor::zeros((2, 3), DType::F32, &dev).unwrap();
        assert!(error(&cache, &rows, &narrow, KvScale::ONE).contains("new values 3 wide"));
        let halves = rows.to_dtype(DType::BF16).unwrap();
        assert!(error(&cache, &rows, &halves, KvScale::ONE).contains("keys in F32 with values in BF16"));
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let err = error(&cache, &rows, &rows, KvScale { k: 1.0, v: bad });
            assert!(err.contains("is not a positive number"), "{err}");
        }
    }
}

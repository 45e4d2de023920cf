//! Causal attention of a flattened batch over a paged KV cache.
//!
//! One call serves any mix of prefill chunks, single decode tokens and multi-token
//! verification windows: each sequence contributes its query rows, and row `i` of a sequence
//! with `q` query rows and `ctx` cached tokens sits at position `ctx - q + i` and attends to
//! positions `0..=pos` (or the last `window` of them). Each (row, head) is computed alone, in
//! key order, so results do not depend on the batch. The cache holds f32 or bf16 (see
//! `CacheElement`); queries and outputs are f32.

use crate::cache_element::CacheElement;
use crate::contiguous::contiguous;
use crate::dot::{dot, dot_x1x8};
use crate::error::bad_input;
use crate::exp::{exp_sum, row_max};
use crate::isa::Isa;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Where every query row of a flattened batch lives in the paged KV cache.
#[derive(Debug, Clone, Default)]
pub struct AttentionMetadata {
    pub block_size: usize,
    /// Offset of each sequence's first query row; one entry per sequence plus the total.
    pub query_start: Vec<usize>,
    /// Tokens cached for each sequence once this batch's rows are written.
    pub context_lens: Vec<usize>,
    /// Physical block ids of each sequence, in logical order.
    pub block_tables: Vec<Vec<u32>>,
    /// Cache slot (block * block_size + offset) of every query row.
    pub slot_mapping: Vec<u32>,
}

impl AttentionMetadata {
    pub fn num_rows(&self) -> usize {
        self.query_start.last().copied().unwrap_or(0)
    }

    pub fn num_sequences(&self) -> usize {
        self.context_lens.len()
    }

    /// Sequence index and position of every query row.
    fn rows(&self) -> Vec<(usize, usize)> {
        let mut rows = Vec::with_capacity(self.num_rows());
        for (s, w) in self.query_start.windows(2).enumerate() {
            let q = w[1] - w[0];
            rows.extend((0..q).map(|i| (s, self.context_lens[s] - q + i)));
        }
        rows
    }

    fn validate(&self, num_slots: usize) -> Result<()> {
        let seqs = self.num_sequences();
        let fail = |msg: String| Err(bad_input("paged_attention", msg));
        if self.block_size == 0 {
            return fail("block_size is 0".into());
        }
        if self.query_start.len() != seqs + 1 || self.block_tables.len() != seqs {
            return fail(format!(
                "{seqs} sequences but {} query offsets and {} block tables",
                self.query_start.len(),
                self.block_tables.len()
            ));
        }
        if self.slot_mapping.len() != self.num_rows() {
            return fail(format!(
                "{} slots for {} rows",
                self.slot_mapping.len(),
                self.num_rows()
            ));
        }
        for s in 0..seqs {
            let (q0, q1) = (self.query_start[s], self.query_start[s + 1]);
            let ctx = self.context_lens[s];
            if q1 < q0 || q1 - q0 > ctx {
                return fail(format!(
                    "sequence {s}: {} query rows but {ctx} cached tokens",
                    q1.wrapping_sub(q0)
                ));
            }
            let table = &self.block_tables[s];
            if table.len() * self.block_size < ctx {
                return fail(format!("sequence {s}: {} blocks cannot hold {ctx} tokens", table.len()));
            }
            if let Some(b) = table.iter().find(|b| (**b as usize + 1) * self.block_size > num_slots) {
                return fail(format!("sequence {s}: block {b} outside the cache"));
            }
        }
        Ok(())
    }
}

/// Head layout of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttentionParams {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    /// Attend only to the last `n` positions (the query's own included).
    pub sliding_window: Option<usize>,
}

/// `q` [rows, heads * head_dim] against `k_cache` and `v_cache` [slots, kv_heads * head_dim],
/// both f32 or both bf16 (rows of this batch already written), giving [rows, heads * head_dim].
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMetadata,
    params: &AttentionParams,
) -> Result<Tensor> {
    q.apply_op3_no_bwd(k_cache, v_cache, &PagedAttention { meta, params })
}

struct PagedAttention<'a> {
    meta: &'a AttentionMetadata,
    params: &'a AttentionParams,
}

impl CustomOp3 for PagedAttention<'_> {
    fn name(&self) -> &'static str {
        "peagle-paged-attention"
    }

    fn cpu_fwd(
        &self,
        qs: &CpuStorage,
        ql: &Layout,
        ks: &CpuStorage,
        kl: &Layout,
        vs: &CpuStorage,
        vl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let p = self.params;
        let (rows, q_width) = ql.shape().dims2()?;
        let (num_slots, kv_width) = kl.shape().dims2()?;
        if q_width != p.num_heads * p.head_dim
            || kv_width != p.num_kv_heads * p.head_dim
            || vl.shape().dims() != kl.shape().dims()
            || p.num_kv_heads == 0
            || !p.num_heads.is_multiple_of(p.num_kv_heads)
            || p.sliding_window == Some(0)
        {
            return Err(bad_input(
                "paged_attention",
                format!(
                    "shapes q {:?}, k {:?}, v {:?} do not fit {p:?}",
                    ql.shape(),
                    kl.shape(),
                    vl.shape()
                ),
            ));
        }
        if rows != self.meta.num_rows() {
            return Err(bad_input(
                "paged_attention",
                format!("{rows} query rows, metadata has {}", self.meta.num_rows()),
            ));
        }
        self.meta.validate(num_slots)?;
        let q = contiguous(qs.as_slice::<f32>()?, ql, "queries")?;
        let out = match (ks, vs) {
            (CpuStorage::F32(k), CpuStorage::F32(v)) => self.attend(q, rows, (k, kl), (v, vl))?,
            (CpuStorage::BF16(k), CpuStorage::BF16(v)) => self.attend(q, rows, (k, kl), (v, vl))?,
            _ => {
                return Err(bad_input(
                    "paged_attention",
                    format!(
                        "key and value caches must be both f32 or both bf16, not {:?} and {:?}",
                        ks.dtype(),
                        vs.dtype()
                    ),
                ))
            }
        };
        Ok((CpuStorage::F32(out), Shape::from((rows, q_width))))
    }
}

impl PagedAttention<'_> {
    fn attend<T: CacheElement>(
        &self,
        q: &[f32],
        rows: usize,
        (k, kl): (&[T], &Layout),
        (v, vl): (&[T], &Layout),
    ) -> Result<Vec<f32>> {
        let p = self.params;
        let q_width = p.num_heads * p.head_dim;
        let k = contiguous(k, kl, "key cache")?;
        let v = contiguous(v, vl, "value cache")?;
        let row_info = self.meta.rows();
        let mut out = vec![0f32; rows * q_width];
        out.par_chunks_mut(q_width)
            .zip(q.par_chunks(q_width))
            .zip(row_info.par_iter())
            .for_each(|((out_row, q_row), &(seq, pos))| {
                let slots = self.key_slots(seq, pos);
                let mut weights = vec![0f32; p.num_heads * slots.len()];
                // Heads are tasks too: a decode step has a single row, and its heads keep every
                // core busy.
                out_row
                    .par_chunks_mut(p.head_dim)
                    .zip(weights.par_chunks_mut(slots.len()))
                    .enumerate()
                    .for_each(|(h, (out_head, weights))| attend_head(q_row, h, (k, v), &slots, p, weights, out_head));
            });
        Ok(out)
    }

    /// Cache slots of the keys visible from `pos`, in position order.
    fn key_slots(&self, seq: usize, pos: usize) -> Vec<usize> {
        let bs = self.meta.block_size;
        let table = &self.meta.block_tables[seq];
        let first = self.params.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
        (first..=pos).map(|j| table[j / bs] as usize * bs + j % bs).collect()
    }
}

/// Query head `h` of one row against the keys and values in `slots`, into `out` [head_dim];
/// `weights` [slots] is room for the softmax weights.
fn attend_head<T: CacheElement>(
    q: &[f32],
    h: usize,
    (k, v): (&[T], &[T]),
    slots: &[usize],
    p: &AttentionParams,
    weights: &mut [f32],
    out: &mut [f32],
) {
    let (d, kv_width) = (p.head_dim, p.num_kv_heads * p.head_dim);
    let kv_off = (h / (p.num_heads / p.num_kv_heads)) * d;
    let qh = &q[h * d..][..d];
    let key = |slot: usize| &k[slot * kv_width + kv_off..][..d];
    let mut eights = slots.chunks_exact(8);
    let mut scored = weights.chunks_exact_mut(8);
    for (ws, eight) in (&mut scored).zip(&mut eights) {
        let scores = dot_x1x8(qh, std::array::from_fn(|i| key(eight[i])));
        for (w, s) in ws.iter_mut().zip(scores) {
            *w = s * p.scale;
        }
    }
    for (w, slot) in scored.into_remainder().iter_mut().zip(eights.remainder()) {
        *w = dot(qh, key(*slot)) * p.scale;
    }
    let sum = exp_sum(weights, row_max(weights));
    for (c, o) in out.chunks_mut(VALUE_CHUNK).enumerate() {
        let (first, width) = (kv_off + c * VALUE_CHUNK, o.len());
        weighted_sum(
            o,
            weights,
            slots.iter().map(|slot| &v[slot * kv_width + first..][..width]),
        );
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o *= inv);
}

/// Value columns summed per pass over the keys: 4 AVX-512 registers of accumulators, or 8 AVX2
/// ones.
const VALUE_CHUNK: usize = 64;

/// `out = Σ weights[j] * values[j]`, in key order for every column, each term rounded before
/// it is added (no fused multiply-add), so every path gives the same bits. The sums stay in
/// registers across the keys (writing them back after every key cost more than the
/// multiplies).
fn weighted_sum<'a, T: CacheElement>(out: &mut [f32], weights: &[f32], values: impl Iterator<Item = &'a [T]>) {
    match <&mut [f32; VALUE_CHUNK]>::try_from(&mut *out) {
        Ok(chunk) => weighted_chunk_on(Isa::detected(), chunk, weights, values),
        Err(_) => {
            out.fill(0.0);
            for (w, value) in weights.iter().zip(values) {
                for (o, x) in out.iter_mut().zip(value) {
                    *o += w * (*x).into();
                }
            }
        }
    }
}

/// `weighted_sum` of a full chunk on `isa`, which this CPU runs (`Isa::runnable`). Without a
/// target feature the portable loop compiles to SSE, 4 lanes wide.
fn weighted_chunk_on<'a, T: CacheElement>(
    isa: Isa,
    out: &mut [f32; VALUE_CHUNK],
    weights: &[f32],
    values: impl Iterator<Item = &'a [T]>,
) {
    match isa {
        // SAFETY: the CPU runs `isa` (the callers' contract).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { weighted_chunk_avx512(out, weights, values) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { weighted_chunk_avx2(out, weights, values) },
        _ => {
            let mut acc = [0f32; VALUE_CHUNK];
            for (w, value) in weights.iter().zip(values) {
                let value: &[T; VALUE_CHUNK] = value.try_into().expect("a full chunk");
                for (a, x) in acc.iter_mut().zip(value) {
                    *a += w * (*x).into();
                }
            }
            *out = acc;
        }
    }
}

/// Accumulates `VALUE_CHUNK` columns in `VALUE_CHUNK / $lanes` registers, each term multiplied
/// and then added, as the portable loop does.
#[cfg(target_arch = "x86_64")]
macro_rules! weighted_chunk {
    ($out:expr, $weights:expr, $values:expr, $t:ty,
     lanes: $lanes:literal, $zero:path, $set1:path, $load:path, $mul:path, $add:path, $store:path) => {{
        let mut acc = [$zero(); VALUE_CHUNK / $lanes];
        for (w, value) in $weights.iter().zip($values) {
            let value: &[$t; VALUE_CHUNK] = value.try_into().expect("a full chunk");
            let w = $set1(*w);
            for (i, a) in acc.iter_mut().enumerate() {
                *a = $add(*a, $mul(w, $load(value[$lanes * i..].as_ptr())));
            }
        }
        for (i, a) in acc.iter().enumerate() {
            $store($out[$lanes * i..].as_mut_ptr(), *a);
        }
    }};
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_chunk_avx512<'a, T: CacheElement>(
    out: &mut [f32; VALUE_CHUNK],
    weights: &[f32],
    values: impl Iterator<Item = &'a [T]>,
) {
    use std::arch::x86_64::*;
    weighted_chunk!(out, weights, values, T, lanes: 16,
        _mm512_setzero_ps, _mm512_set1_ps, T::load16, _mm512_mul_ps, _mm512_add_ps, _mm512_storeu_ps)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn weighted_chunk_avx2<'a, T: CacheElement>(
    out: &mut [f32; VALUE_CHUNK],
    weights: &[f32],
    values: impl Iterator<Item = &'a [T]>,
) {
    use std::arch::x86_64::*;
    weighted_chunk!(out, weights, values, T, lanes: 8,
        _mm256_setzero_ps, _mm256_set1_ps, T::load8, _mm256_mul_ps, _mm256_add_ps, _mm256_storeu_ps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn values() -> (Vec<Vec<f32>>, Vec<f32>) {
        let values = (0..37)
            .map(|j| {
                (0..VALUE_CHUNK)
                    .map(|i| ((i * 7 + j * 13) as f32 * 0.37).sin())
                    .collect()
            })
            .collect();
        let weights = (0..37).map(|j| (j as f32 * 0.11).cos().abs()).collect();
        (values, weights)
    }

    fn to_bf16(values: &[Vec<f32>]) -> Vec<Vec<bf16>> {
        values
            .iter()
            .map(|v| v.iter().map(|x| bf16::from_f32(*x)).collect())
            .collect()
    }

    fn chunk_bits<T: CacheElement>(isa: Isa, weights: &[f32], values: &[Vec<T>]) -> [u32; VALUE_CHUNK] {
        let mut out = [0f32; VALUE_CHUNK];
        weighted_chunk_on(isa, &mut out, weights, values.iter().map(|v| &v[..]));
        out.map(f32::to_bits)
    }

    #[test]
    fn every_path_sums_a_chunk_as_the_portable_one_bitwise() {
        let (values, weights) = values();
        let halves = to_bf16(&values);
        for isa in Isa::runnable() {
            let portable = chunk_bits(Isa::Portable, &weights, &values);
            assert_eq!(chunk_bits(isa, &weights, &values), portable, "{isa:?}");
            let portable = chunk_bits(Isa::Portable, &weights, &halves);
            assert_eq!(chunk_bits(isa, &weights, &halves), portable, "{isa:?} bf16");
        }
    }

    #[test]
    fn bf16_values_sum_exactly_as_their_f32_values() {
        let (values, weights) = values();
        let halves = to_bf16(&values);
        let wide: Vec<Vec<f32>> = halves
            .iter()
            .map(|v| v.iter().map(|x| f32::from(*x)).collect())
            .collect();
        for width in [VALUE_CHUNK, 24] {
            let (mut from_half, mut from_wide) = (vec![0f32; width], vec![0f32; width]);
            weighted_sum(&mut from_half, &weights, halves.iter().map(|v| &v[..width]));
            weighted_sum(&mut from_wide, &weights, wide.iter().map(|v| &v[..width]));
            let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&from_half), bits(&from_wide), "width {width}");
        }
    }
}

//! Causal attention of a flattened batch over a paged KV cache.
//!
//! One call serves any mix of prefill chunks, single decode tokens and multi-token
//! verification windows: each sequence contributes its query rows, and row `i` of a sequence
//! with `q` query rows and `ctx` cached tokens sits at position `ctx - q + i` and attends to
//! positions `0..=pos` (or the last `window` of them). The query heads that share a key head
//! are scored and summed together, so each key and value is read once for all of them, but
//! every (row, head) output is the same chain of operations in key order whatever shares its
//! call (see `dot` and `value_sum`), so results do not depend on the batch. The cache holds
//! f32, bf16 or FP8 e4m3 (see `CacheElement`), FP8 with a per-tensor scale (`KvScale`);
//! queries and outputs are f32.

use crate::attention_metadata::AttentionMetadata;
use crate::cache_element::CacheElement;
use crate::contiguous::{contiguous, strided_rows, StridedRows};
use crate::dot::dots;
use crate::error::bad_input;
use crate::exp::{exp, exp_sum, row_max};
use crate::head_rows::HeadRows;
use crate::pool::{enough_tasks, for_each_chunk};
use crate::rope::Rotation;
use crate::value_sum::value_sums;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Device, Layout, Result, Shape, Tensor};

/// One sink logit per query head (gpt-oss), on the host and, for a GPU, on the device.
#[derive(Debug, Clone)]
pub struct Sinks {
    values: Vec<f32>,
    device: Option<Tensor>,
}

impl Sinks {
    /// `values` for kernels on `device`.
    pub fn new(values: Vec<f32>, device: &Device) -> Result<Self> {
        let on_device = match device {
            Device::Cpu => None,
            _ => Some(Tensor::from_slice(&values, values.len(), device)?),
        };
        Ok(Self {
            values,
            device: on_device,
        })
    }

    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// The device copy, for a GPU's kernels.
    pub fn on_device(&self) -> Option<&Tensor> {
        self.device.as_ref()
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
    /// How the cache's elements scale back to keys and values.
    pub kv_scale: KvScale,
}

/// Per-tensor scales of a layer's cache, as vLLM has them for FP8: a key `x` is stored as
/// `x / k` and read back as `stored * k`, a value likewise with `v`. A cache that holds the
/// values themselves (f32, bf16) has scales of 1, which change no bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvScale {
    pub k: f32,
    pub v: f32,
}

impl KvScale {
    pub const ONE: Self = Self { k: 1.0, v: 1.0 };
}

impl Default for KvScale {
    fn default() -> Self {
        Self::ONE
    }
}

/// `q` [rows, heads * head_dim] (its rows may be strided, as a column range of the rotated
/// queries and keys) against `k_cache` and `v_cache` [slots, kv_heads * head_dim], of one
/// element type (rows of this batch already written), giving [rows, heads * head_dim].
///
/// `sinks`, one logit per query head (gpt-oss), join each head's softmax denominator and
/// nothing else: the weights are `exp(s - m)` over the keys, divided by their sum plus
/// `exp(sink - m)`, with `m` the largest of the scores and the sink.
pub fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMetadata,
    params: &AttentionParams,
    sinks: Option<&Sinks>,
) -> Result<Tensor> {
    paged_attention_by(q, k_cache, v_cache, meta, params, sinks, AttentionBlocks::ByBatch)
}

/// How a GPU's attention launch gives blocks to a long row's parts of its keys and to a row's
/// query heads (`kernels/paged_attention.cu`). Every choice gives the same bits, only sooner or
/// later: inference takes `ByBatch`, and the others are for comparing with it. The CPU ignores
/// it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionBlocks {
    /// Where a launch has few rows, several blocks share each row's parts; where one head a
    /// block would more than fill the GPU, a row's query heads of one KV head share a block.
    ByBatch,
    /// One block walks each row's parts, for one head.
    OneARow,
    /// As `ByBatch`, but a row's query heads of one KV head share a block wherever no rows
    /// share one, however few the blocks.
    HeadGroups,
}

/// `paged_attention`, its blocks given as `blocks` says.
pub fn paged_attention_by(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMetadata,
    params: &AttentionParams,
    sinks: Option<&Sinks>,
    blocks: AttentionBlocks,
) -> Result<Tensor> {
    let op = PagedAttention {
        blocks,
        ..PagedAttention::plain(meta, params, sinks)
    };
    q.apply_op3_no_bwd(k_cache, v_cache, &op)
}

/// `paged_attention` of the queries `q` rotated by `rotation` (as `Rotation::apply` rotates
/// them): on a GPU the attention kernel rotates each query as it reads it.
pub fn rotated_paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMetadata,
    params: &AttentionParams,
    sinks: Option<&Sinks>,
    rotation: Rotation,
) -> Result<Tensor> {
    if q.device().is_cpu() {
        return paged_attention(&rotation.apply(q)?, k_cache, v_cache, meta, params, sinks);
    }
    let op = PagedAttention {
        rotation: Some(rotation),
        ..PagedAttention::plain(meta, params, sinks)
    };
    q.apply_op3_no_bwd(k_cache, v_cache, &op)
}

struct PagedAttention<'a> {
    meta: &'a AttentionMetadata,
    params: &'a AttentionParams,
    sinks: Option<&'a Sinks>,
    /// The queries' rotation, which only the GPU's kernel applies (`rotated_paged_attention`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    rotation: Option<Rotation<'a>>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    blocks: AttentionBlocks,
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
        let (rows, q_width) = self.check(ql, kl, vl)?;
        let q_rows = strided_rows(ql, "paged_attention", "the queries")?;
        let q = (qs.as_slice::<f32>()?, &q_rows);
        let out = match (ks, vs) {
            (CpuStorage::F32(k), CpuStorage::F32(v)) => self.attend(q, rows, (k, kl), (v, vl))?,
            (CpuStorage::BF16(k), CpuStorage::BF16(v)) => self.attend(q, rows, (k, kl), (v, vl))?,
            (CpuStorage::F8E4M3(k), CpuStorage::F8E4M3(v)) => self.attend(q, rows, (k, kl), (v, vl))?,
            _ => {
                return Err(bad_input(
                    "paged_attention",
                    format!(
                        "key and value caches must be both f32, both bf16 or both f8e4m3, not {:?} and {:?}",
                        ks.dtype(),
                        vs.dtype()
                    ),
                ))
            }
        };
        Ok((CpuStorage::F32(out), Shape::from((rows, q_width))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        qs: &candle_core::CudaStorage,
        ql: &Layout,
        ks: &candle_core::CudaStorage,
        kl: &Layout,
        vs: &candle_core::CudaStorage,
        vl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (rows, width) = self.check(ql, kl, vl)?;
        let rotation = self
            .rotation
            .map(|r| r.checked("paged_attention", rows, width))
            .transpose()?;
        let extra = crate::cuda::AttentionInputs {
            meta: self.meta,
            params: self.params,
            sinks: self.sinks,
            rotation,
            blocks: self.blocks,
        };
        crate::cuda::paged_attention((qs, ql), (ks, kl), (vs, vl), &extra)
    }
}

impl<'a> PagedAttention<'a> {
    /// Attention of queries as they are.
    fn plain(meta: &'a AttentionMetadata, params: &'a AttentionParams, sinks: Option<&'a Sinks>) -> Self {
        Self {
            meta,
            params,
            sinks,
            rotation: None,
            blocks: AttentionBlocks::ByBatch,
        }
    }

    /// Checks the shapes against the head layout and the metadata against the cache; returns
    /// the query rows and width.
    fn check(&self, ql: &Layout, kl: &Layout, vl: &Layout) -> Result<(usize, usize)> {
        let p = self.params;
        let (rows, q_width) = ql.shape().dims2()?;
        let (num_slots, kv_width) = kl.shape().dims2()?;
        if q_width != p.num_heads * p.head_dim
            || kv_width != p.num_kv_heads * p.head_dim
            || vl.shape().dims() != kl.shape().dims()
            || p.num_kv_heads == 0
            || !p.num_heads.is_multiple_of(p.num_kv_heads)
            || p.sliding_window == Some(0)
            || !(p.kv_scale.k.is_finite() && p.kv_scale.k > 0.0)
            || !(p.kv_scale.v.is_finite() && p.kv_scale.v > 0.0)
            || self.sinks.is_some_and(|s| s.values.len() != p.num_heads)
        {
            return Err(bad_input(
                "paged_attention",
                format!(
                    "shapes q {:?}, k {:?}, v {:?} and {} sinks do not fit {p:?}",
                    ql.shape(),
                    kl.shape(),
                    vl.shape(),
                    self.sinks.map_or(0, |s| s.values.len())
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
        Ok((rows, q_width))
    }

    /// `q` is the queries' storage and where their rows lie in it.
    fn attend<T: CacheElement>(
        &self,
        (q, q_rows): (&[f32], &StridedRows),
        rows: usize,
        (k, kl): (&[T], &Layout),
        (v, vl): (&[T], &Layout),
    ) -> Result<Vec<f32>> {
        let p = self.params;
        let q_width = p.num_heads * p.head_dim;
        let k = contiguous(k, kl, "key cache")?;
        let v = contiguous(v, vl, "value cache")?;
        let row_info = self.meta.rows();
        let (group, d) = (p.num_heads / p.num_kv_heads, p.head_dim);
        let kv_width = p.num_kv_heads * d;
        let mut out = vec![0f32; rows * q_width];
        // A task is a row's key heads, or a share of them when rows are too few to give every
        // thread a few tasks (a decode step of one sequence). Each key head reads its own
        // lines of the same cache slots, which the prefetcher fetches in pairs: at 16
        // sequences, a row's two key heads taken by different threads made attention 20%
        // slower than one thread taking both.
        let heads_per_task = heads_per_task(rows, p.num_kv_heads);
        let pieces = p.num_kv_heads / heads_per_task;
        for_each_chunk(&mut out, heads_per_task * group * d, |task, out| {
            let (row, first) = (task / pieces, task % pieces * heads_per_task);
            let (seq, pos) = row_info[row];
            let slots = self.key_slots(seq, pos);
            let mut weights = vec![0f32; group * slots.len()];
            for (i, out) in out.chunks_exact_mut(group * d).enumerate() {
                let g = first + i;
                let rows = |data| HeadRows {
                    data,
                    slots: &slots,
                    width: kv_width,
                    offset: g * d,
                    head_dim: d,
                };
                let q = &q_rows.row(q, row)[g * group * d..][..group * d];
                let sinks = self.sinks.map(|s| &s.values[g * group..][..group]);
                attend_key_head(q, (rows(k), rows(v)), p, sinks, &mut weights, out)
            }
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

/// Key heads per task: all of a row's, or the most that still make `enough_tasks` over `rows`.
fn heads_per_task(rows: usize, kv_heads: usize) -> usize {
    (1..=kv_heads)
        .rev()
        .find(|h| kv_heads.is_multiple_of(*h) && rows * (kv_heads / h) >= enough_tasks())
        .unwrap_or(1)
}

/// The query heads of one row that read one key head's `keys` and `values` (`q`, `sinks` and
/// `out` hold them side by side, `weights` their softmax weights, one row of keys each), in
/// groups of up to 8 that score and sum together.
fn attend_key_head<T: CacheElement>(
    q: &[f32],
    kv: (HeadRows<T>, HeadRows<T>),
    p: &AttentionParams,
    sinks: Option<&[f32]>,
    weights: &mut [f32],
    out: &mut [f32],
) {
    let (d, n) = (p.head_dim, kv.0.len());
    let heads = q.len() / d;
    let mut done = 0;
    while done < heads {
        let h = [8, 4, 2, 1].into_iter().find(|h| *h <= heads - done).unwrap_or(1);
        let (q, out) = (&q[done * d..][..h * d], &mut out[done * d..][..h * d]);
        let weights = &mut weights[done * n..][..h * n];
        let sinks = sinks.map(|s| &s[done..][..h]);
        match h {
            8 => attend::<T, 8, 1>(q, kv, p, sinks, weights, out),
            4 => attend::<T, 4, 2>(q, kv, p, sinks, weights, out),
            2 => attend::<T, 2, 4>(q, kv, p, sinks, weights, out),
            _ => attend::<T, 1, 8>(q, kv, p, sinks, weights, out),
        }
        done += h;
    }
}

/// `H` query heads against one key head, scoring `C` keys at a time (`H * C` = 8 sums in
/// flight), each head's softmax alone, then the value sums of all `H` together. The cache's
/// scales join the score's scale and the final division, never the element loop.
fn attend<T: CacheElement, const H: usize, const C: usize>(
    q: &[f32],
    (keys, values): (HeadRows<T>, HeadRows<T>),
    p: &AttentionParams,
    sinks: Option<&[f32]>,
    weights: &mut [f32],
    out: &mut [f32],
) {
    let (d, n) = (p.head_dim, keys.len());
    let queries: [&[f32]; H] = std::array::from_fn(|h| &q[h * d..][..d]);
    let scale = p.scale * p.kv_scale.k;
    let whole = n / C * C;
    for j in (0..whole).step_by(C) {
        let block = dots(queries, std::array::from_fn::<_, C, _>(|c| keys.row(j + c)));
        put_scores(weights, n, j, block, scale);
    }
    for j in whole..n {
        put_scores(weights, n, j, dots(queries, [keys.row(j)]), scale);
    }
    let mut sums = [0f32; H];
    for (h, w) in weights.chunks_exact_mut(n).enumerate() {
        sums[h] = match sinks.map(|s| s[h]) {
            None => exp_sum(w, row_max(w)),
            Some(sink) => {
                let max = row_max(w).max(sink);
                exp_sum(w, max) + exp(sink - max)
            }
        };
    }
    let mut heads = out.chunks_exact_mut(d);
    let outs: [&mut [f32]; H] = std::array::from_fn(|_| heads.next().expect("H heads"));
    let mut rows = weights.chunks_exact(n);
    let weight_rows: [&[f32]; H] = std::array::from_fn(|_| rows.next().expect("H heads"));
    value_sums(outs, weight_rows, values);
    for (o, sum) in out.chunks_exact_mut(d).zip(sums) {
        let inv = p.kv_scale.v / sum;
        o.iter_mut().for_each(|x| *x *= inv);
    }
}

/// Scaled scores of keys `j..j + C` into each head's row of `weights` (`n` keys a row).
fn put_scores<const H: usize, const C: usize>(
    weights: &mut [f32],
    n: usize,
    j: usize,
    block: [[f32; C]; H],
    scale: f32,
) {
    for (h, scores) in block.iter().enumerate() {
        for (w, s) in weights[h * n + j..][..C].iter_mut().zip(scores) {
            *w = s * scale;
        }
    }
}

//! Paged attention against a dense causal reference, on scattered blocks and mixed batches,
//! over f32, bf16 and FP8 caches (`cache_dtypes`), on rayon's pool and on a step's crew.

mod cache_dtypes;

use candle_core::{DType, Device, Tensor};
use float8::F8E4M3;
use half::bf16;
use peagle_kernels::{
    on_pool, paged_attention, write_kv, AttentionMetadata, AttentionParams, KvScale, Sinks, PAD_SLOT,
};

const BLOCK: usize = 4;
const PARAMS: AttentionParams = AttentionParams {
    num_heads: 4,
    num_kv_heads: 2,
    // A full AVX-512 value chunk, so the vector paths run.
    head_dim: 64,
    scale: 0.125,
    sliding_window: None,
    kv_scale: KvScale::ONE,
};

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_add(0x9e3779b97f4a7c15);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// One sequence's full K, V and Q in position order, plus its (scattered) block table.
struct Seq {
    params: AttentionParams,
    len: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    blocks: Vec<u32>,
}

fn seq(len: usize, seed: u64, blocks: Vec<u32>) -> Seq {
    seq_of(PARAMS, len, seed, blocks)
}

fn seq_of(params: AttentionParams, len: usize, seed: u64, blocks: Vec<u32>) -> Seq {
    let qw = params.num_heads * params.head_dim;
    let kw = params.num_kv_heads * params.head_dim;
    Seq {
        params,
        len,
        q: values(len * qw, seed),
        k: values(len * kw, seed + 1),
        v: values(len * kw, seed + 2),
        blocks,
    }
}

/// The first `len` positions of `s`, on the same blocks.
fn prefix(s: &Seq, len: usize) -> Seq {
    Seq {
        params: s.params,
        len,
        q: s.q.clone(),
        k: s.k.clone(),
        v: s.v.clone(),
        blocks: s.blocks.clone(),
    }
}

fn slot(s: &Seq, pos: usize) -> u32 {
    s.blocks[pos / BLOCK] * BLOCK as u32 + (pos % BLOCK) as u32
}

/// Dense causal attention of row `pos` of `s`, in f64.
fn reference_row(s: &Seq, pos: usize, window: Option<usize>) -> Vec<f32> {
    reference_row_with_sinks(s, pos, window, None)
}

/// `reference_row` with a sink logit per query head: one more term of each softmax's
/// denominator, with no value.
fn reference_row_with_sinks(s: &Seq, pos: usize, window: Option<usize>, sinks: Option<&[f32]>) -> Vec<f32> {
    let p = s.params;
    let (d, group) = (p.head_dim, p.num_heads / p.num_kv_heads);
    let kw = p.num_kv_heads * d;
    let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let mut out = vec![0f32; p.num_heads * d];
    for h in 0..p.num_heads {
        let g = h / group;
        let q = &s.q[(pos * p.num_heads + h) * d..][..d];
        let scores: Vec<f64> = (first..=pos)
            .map(|j| {
                let k = &s.k[j * kw + g * d..][..d];
                q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * p.scale as f64
            })
            .collect();
        let sink = sinks.map(|s| s[h] as f64);
        let max = scores.iter().cloned().chain(sink).fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
        for (i, j) in (first..=pos).enumerate() {
            let v = &s.v[j * kw + g * d..][..d];
            for c in 0..d {
                out[h * d + c] += (e[i] / sum * v[c] as f64) as f32;
            }
        }
    }
    out
}

/// A layer's cache as `write_kv` writes it, [2, slots, width], and its halves.
struct Cache {
    both: Tensor,
    k: Tensor,
    v: Tensor,
}

impl Cache {
    fn zeros(dtype: DType, slots: usize, width: usize) -> Self {
        let both = Tensor::zeros((2, slots, width), dtype, &Device::Cpu).unwrap();
        Cache {
            k: both.get(0).unwrap(),
            v: both.get(1).unwrap(),
            both,
        }
    }
}

fn cache_with(seqs: &[&Seq], num_blocks: usize) -> Cache {
    cache_of(DType::F32, seqs, num_blocks)
}

fn cache_of(dtype: DType, seqs: &[&Seq], num_blocks: usize) -> Cache {
    let scale = seqs[0].params.kv_scale;
    let kw = seqs[0].params.num_kv_heads * seqs[0].params.head_dim;
    let dev = Device::Cpu;
    let cache = Cache::zeros(dtype, num_blocks * BLOCK, kw);
    for s in seqs {
        let slots: Vec<u32> = (0..s.len).map(|p| slot(s, p)).collect();
        let k = Tensor::from_slice(&s.k, (s.len, kw), &dev).unwrap();
        let v = Tensor::from_slice(&s.v, (s.len, kw), &dev).unwrap();
        write_kv(&cache.both, &k, &v, &at_slots(&slots), scale).unwrap();
    }
    cache
}

/// Metadata whose rows go to `slots`, all `write_kv` reads.
fn at_slots(slots: &[u32]) -> AttentionMetadata {
    AttentionMetadata {
        slot_mapping: slots.to_vec(),
        ..Default::default()
    }
}

/// Runs the last `rows[i]` positions of each sequence as one flattened batch.
fn run(cache: &Cache, seqs: &[&Seq], rows: &[usize], window: Option<usize>) -> Vec<Vec<f32>> {
    run_with_sinks(cache, seqs, rows, window, None)
}

/// `run` with a sink logit per query head.
fn run_with_sinks(
    cache: &Cache,
    seqs: &[&Seq],
    rows: &[usize],
    window: Option<usize>,
    sinks: Option<&[f32]>,
) -> Vec<Vec<f32>> {
    let params = seqs[0].params;
    let qw = params.num_heads * params.head_dim;
    let mut meta = AttentionMetadata {
        block_size: BLOCK,
        query_start: vec![0],
        ..Default::default()
    };
    let mut q = Vec::new();
    for (s, &r) in seqs.iter().zip(rows) {
        for pos in s.len - r..s.len {
            q.extend_from_slice(&s.q[pos * qw..][..qw]);
            meta.slot_mapping.push(slot(s, pos));
        }
        meta.query_start.push(meta.query_start.last().unwrap() + r);
        meta.context_lens.push(s.len);
        meta.block_tables.push(s.blocks.clone());
    }
    let q = Tensor::from_vec(q, (meta.num_rows(), qw), &Device::Cpu).unwrap();
    let params = AttentionParams {
        sliding_window: window,
        ..params
    };
    let sinks = sinks.map(|s| Sinks::new(s.to_vec(), &Device::Cpu).unwrap());
    let attend = || {
        paged_attention(&q, &cache.k, &cache.v, &meta, &params, sinks.as_ref())
            .unwrap()
            .to_vec2()
            .unwrap()
    };
    let out = attend();
    // Inside a step the kernels split their tasks over `on_pool`'s crew: the same bits.
    assert_eq!(on_pool(attend), out, "on the pool's crew");
    // Queries read in place as a column range of a wider tensor (the rotated queries and
    // keys): the same bits.
    let rows = meta.num_rows();
    let wide = Tensor::cat(&[&Tensor::ones((rows, 3), DType::F32, &Device::Cpu).unwrap(), &q], 1).unwrap();
    let in_place = paged_attention(
        &wide.narrow(1, 3, qw).unwrap(),
        &cache.k,
        &cache.v,
        &meta,
        &params,
        sinks.as_ref(),
    )
    .unwrap()
    .to_vec2::<f32>()
    .unwrap();
    assert_eq!(in_place, out, "queries read in place");
    out
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() < 1e-5, "{what}[{i}]: {g} vs {w}");
    }
}

#[test]
fn mixed_batch_matches_dense_reference() {
    // A prefill chunk over cached context, a single decode token and a 4-row window,
    // on scattered, interleaved blocks.
    let a = seq(11, 10, vec![7, 2, 9]);
    let b = seq(6, 20, vec![0, 5]);
    let c = seq(9, 30, vec![3, 8, 1]);
    let cache = cache_with(&[&a, &b, &c], 10);
    for window in [None, Some(3)] {
        let out = run(&cache, &[&a, &b, &c], &[5, 1, 4], window);
        let mut row = 0;
        for (s, r) in [(&a, 5), (&b, 1), (&c, 4)] {
            for pos in s.len - r..s.len {
                assert_close(&out[row], &reference_row(s, pos, window), "row");
                row += 1;
            }
        }
    }
}

/// gpt-oss's sinks: each head's sink logit joins its softmax's denominator only, with or
/// without a window; a row keeps its bits in any batch; a sink of -inf changes nothing.
#[test]
fn sinks_join_each_heads_denominator_only() {
    let params = AttentionParams {
        num_heads: 12,
        num_kv_heads: 1,
        ..PARAMS
    };
    let a = seq_of(params, 11, 60, vec![7, 2, 9]);
    let b = seq_of(params, 6, 70, vec![0, 5]);
    let cache = cache_with(&[&a, &b], 10);
    // Around the scores (|s| < 8): a sink that barely counts, one that dominates, and between.
    let sinks: Vec<f32> = (0..12).map(|h| h as f32 * 1.5 - 8.0).collect();
    for window in [None, Some(3)] {
        let out = run_with_sinks(&cache, &[&a, &b], &[5, 1], window, Some(&sinks));
        let mut row = 0;
        for (s, r) in [(&a, 5), (&b, 1)] {
            for pos in s.len - r..s.len {
                let want = reference_row_with_sinks(s, pos, window, Some(&sinks));
                assert_close(&out[row], &want, "row with sinks");
                let alone = run_with_sinks(&cache, &[&prefix(s, pos + 1)], &[1], window, Some(&sinks));
                assert_eq!(alone[0], out[row], "row {row} alone");
                row += 1;
            }
        }
    }
    let none = vec![f32::NEG_INFINITY; 12];
    assert_eq!(
        run_with_sinks(&cache, &[&a, &b], &[5, 1], None, Some(&none)),
        run(&cache, &[&a, &b], &[5, 1], None)
    );
}

#[test]
fn rows_are_bitwise_independent_of_the_batch() {
    let a = seq(13, 40, vec![4, 0, 6, 2]);
    let b = seq(5, 50, vec![1, 3]);
    let cache = cache_with(&[&a, &b], 8);
    let batch = run(&cache, &[&a, &b], &[8, 2], None);
    for (r, row) in batch.iter().take(8).enumerate() {
        let pos = a.len - 8 + r;
        let alone = run(&cache, &[&prefix(&a, pos + 1)], &[1], None);
        assert_eq!(&alone[0], row, "row {r}");
    }
}

/// Query heads that share a key head are scored and summed together, in groups of 8, 4, 2 and
/// 1; value columns go in passes of a few vectors and a scalar tail. Every head layout must
/// match the reference, and each row alone must give the bits it gives in a batch.
#[test]
fn every_head_layout_matches_the_reference_and_is_batch_invariant() {
    // (query heads, key heads, head_dim): multi-head, groups of 3, 8 (one key head), 12 (8 + 4)
    // and 7 (4 + 2 + 1), and head sizes with a tail past the vector passes.
    for (heads, kv_heads, head_dim) in [
        (4, 4, 64),
        (6, 2, 64),
        (8, 1, 64),
        (12, 1, 32),
        (14, 2, 80),
        (16, 2, 128),
    ] {
        let params = AttentionParams {
            num_heads: heads,
            num_kv_heads: kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: None,
            kv_scale: KvScale::ONE,
        };
        let what = format!("{heads} heads over {kv_heads}, head_dim {head_dim}");
        let a = seq_of(params, 13, 60, vec![4, 0, 6, 2]);
        let b = seq_of(params, 6, 70, vec![1, 3]);
        for dtype in [DType::F32, DType::BF16, DType::F8E4M3] {
            let cache = cache_of(dtype, &[&a, &b], 8);
            let batch = run(&cache, &[&a, &b], &[5, 1], None);
            let rows = (a.len - 5..a.len).map(|pos| (&a, pos)).chain([(&b, b.len - 1)]);
            for ((s, pos), got) in rows.zip(&batch) {
                if dtype == DType::F32 {
                    assert_close(got, &reference_row(s, pos, None), &format!("{what}, position {pos}"));
                }
                let alone = run(&cache, &[&prefix(s, pos + 1)], &[1], None);
                assert_eq!(&alone[0], got, "{what}, {dtype:?}, position {pos} alone");
            }
        }
    }
}

#[test]
fn inconsistent_metadata_is_an_error_not_a_panic() {
    let a = seq(6, 60, vec![0, 1]);
    let cache = cache_with(&[&a], 2);
    let qw = PARAMS.num_heads * PARAMS.head_dim;
    let q = Tensor::zeros((2, qw), DType::F32, &Device::Cpu).unwrap();
    let too_long = AttentionMetadata {
        block_size: BLOCK,
        query_start: vec![0, 2],
        context_lens: vec![9],
        block_tables: vec![vec![0, 1]],
        slot_mapping: vec![7, 8],
        device: None,
    };
    let err = paged_attention(&q, &cache.k, &cache.v, &too_long, &PARAMS, None).unwrap_err();
    assert!(err.to_string().contains("cannot hold 9 tokens"), "{err}");
    let no_window = AttentionParams {
        sliding_window: Some(0),
        ..PARAMS
    };
    let fits = AttentionMetadata {
        context_lens: vec![6],
        slot_mapping: vec![4, 5],
        ..too_long
    };
    let err = paged_attention(&q, &cache.k, &cache.v, &fits, &no_window, None).unwrap_err();
    assert!(err.to_string().contains("sliding_window: Some(0)"), "{err}");
    let three = Sinks::new(vec![0.0; 3], &Device::Cpu).unwrap();
    let err = paged_attention(&q, &cache.k, &cache.v, &fits, &PARAMS, Some(&three)).unwrap_err();
    assert!(err.to_string().contains("and 3 sinks do not fit"), "{err}");
}

//! Paged attention and the KV write, against the CPU and batch invariant, and their forms that
//! rotate what they read.
use super::{bits, gpu, host, interleaved_batch, max_rel_diff, tensor, values};
use candle_core::{DType, Device, Tensor};
use peagle_kernels::{
    paged_attention, paged_attention_by, rotated_paged_attention, write_kv, write_rotated_kv, AttentionBlocks,
    AttentionMetadata, AttentionParams, KvScale, Rotation, Sinks, PAD_SLOT,
};

/// A batch's metadata and queries, and a paged cache of random keys and values.
struct Batch {
    meta: AttentionMetadata,
    q: Tensor,
    k: Tensor,
    v: Tensor,
}

const BLOCK: usize = 16;

/// Sequences of `(context length, query rows)` on interleaved blocks; rows of every sequence's
/// context already written.
fn batch(seqs: &[(usize, usize)], params: AttentionParams, seed: u64) -> Batch {
    let blocks_each = seqs.iter().map(|(len, _)| len.div_ceil(BLOCK)).max().unwrap();
    let num_blocks = blocks_each * seqs.len();
    let meta = interleaved_batch(seqs, BLOCK);
    let kv_width = params.num_kv_heads * params.head_dim;
    Batch {
        q: tensor((meta.num_rows(), params.num_heads * params.head_dim), seed, 1.0),
        k: tensor((num_blocks * BLOCK, kv_width), seed + 1, 1.0),
        v: tensor((num_blocks * BLOCK, kv_width), seed + 2, 1.0),
        meta,
    }
}

#[test]
fn paged_attention_matches_the_cpu_kernel_and_is_batch_invariant() {
    let Some(dev) = gpu() else { return };
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    // gpt-oss's heads (64 query, 8 KV, head_dim 64), a Llama-like layout, the largest head, and
    // one whose keys are read an element a load (head_dim not a multiple of 8).
    for (heads, kv_heads, d) in [(64, 8, 64), (8, 2, 128), (4, 4, 256), (2, 1, 12)] {
        for window in [None, Some(128), Some(5), Some(1500)] {
            for with_sinks in [false, true] {
                let params = AttentionParams {
                    num_heads: heads,
                    num_kv_heads: kv_heads,
                    head_dim: d,
                    scale: 1.0 / (d as f32).sqrt(),
                    sliding_window: window,
                    kv_scale: KvScale::ONE,
                };
                let sink_values = with_sinks.then(|| values(heads, 99, 3.0));
                let sinks = sink_values.clone().map(|v| Sinks::new(v, &Device::Cpu).unwrap());
                let gpu_sinks = sink_values.map(|v| Sinks::new(v, &dev).unwrap());
                let (sinks, gpu_sinks) = (sinks.as_ref(), gpu_sinks.as_ref());
                // A prefill chunk over context, a decode row, an 8-row verification window, a
                // long context of several key tiles, and two rows of a context long enough to give
                // each of the kernel's warps many tiles, in three parts of the keys (two under a
                // window of 1500).
                let b = batch(&[(40, 17), (9, 1), (300, 8), (700, 1), (2100, 2)], params, 11);
                let gpu_meta = b.meta.clone().on_device(&dev).unwrap();
                let what = format!("heads {heads}/{kv_heads}x{d}, window {window:?}, sinks {with_sinks}");
                let want = paged_attention(&b.q, &b.k, &b.v, &b.meta, &params, sinks).unwrap();
                let got = paged_attention(&g(&b.q), &g(&b.k), &g(&b.v), &gpu_meta, &params, gpu_sinks).unwrap();
                let diff = max_rel_diff(&host(&got), &host(&want));
                assert!(diff < 1e-5, "{what}: f32 cache off by {diff}");
                // One block walking each row's parts, and a row's heads of a KV head sharing a
                // block wherever rows do not, give the bits of the launch's own choice.
                for blocks in [AttentionBlocks::OneARow, AttentionBlocks::HeadGroups] {
                    let by = paged_attention_by(&g(&b.q), &g(&b.k), &g(&b.v), &gpu_meta, &params, gpu_sinks, blocks);
                    assert_eq!(bits(&by.unwrap()), bits(&got), "{what}: {blocks:?}");
                }
                // Queries read in place as a column range of a wider tensor: the same bits.
                let rows = b.meta.num_rows();
                let wide = Tensor::cat(&[&tensor((rows, 8), 15, 1.0), &b.q], 1).unwrap();
                let in_place = paged_attention(
                    &g(&wide).narrow(1, 8, heads * d).unwrap(),
                    &g(&b.k),
                    &g(&b.v),
                    &gpu_meta,
                    &params,
                    gpu_sinks,
                )
                .unwrap();
                assert_eq!(bits(&in_place), bits(&got), "{what}: queries read in place");

                // bf16 queries and cache, against the CPU on the same rounded values.
                let r = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
                let got_bf16 =
                    paged_attention(&g(&r(&b.q)), &g(&r(&b.k)), &g(&r(&b.v)), &gpu_meta, &params, gpu_sinks).unwrap();
                let f = |t: &Tensor| r(t).to_dtype(DType::F32).unwrap();
                let want = paged_attention(&f(&b.q), &r(&b.k), &r(&b.v), &b.meta, &params, sinks).unwrap();
                let diff = max_rel_diff(&host(&got_bf16), &host(&want));
                assert!(diff < 1e-2, "{what}: bf16 off by {diff}");

                // An FP8 cache with per-tensor scales, made on the host: the same bytes on both.
                let fp8 = AttentionParams {
                    kv_scale: KvScale { k: 0.5, v: 0.125 },
                    ..params
                };
                let e4m3 = |t: &Tensor, scale: f32| (t / scale as f64).unwrap().to_dtype(DType::F8E4M3).unwrap();
                let (k8, v8) = (e4m3(&b.k, 0.5), e4m3(&b.v, 0.125));
                let want = paged_attention(&b.q, &k8, &v8, &b.meta, &fp8, sinks).unwrap();
                let got_fp8 = paged_attention(&g(&b.q), &g(&k8), &g(&v8), &gpu_meta, &fp8, gpu_sinks).unwrap();
                let diff = max_rel_diff(&host(&got_fp8), &host(&want));
                assert!(diff < 1e-5, "{what}: fp8 cache off by {diff}");

                // Rows alone give the same bits as within the batch, with their heads grouped
                // or not: the 8-row window's last, and the long context's two, whose parts of
                // the keys more blocks share alone.
                let rows_alone = |seq: usize, rows: std::ops::Range<usize>| {
                    let alone = AttentionMetadata {
                        block_size: BLOCK,
                        query_start: vec![0, rows.len()],
                        context_lens: vec![b.meta.context_lens[seq]],
                        block_tables: vec![b.meta.block_tables[seq].clone()],
                        slot_mapping: b.meta.slot_mapping[rows.clone()].to_vec(),
                        device: None,
                    }
                    .on_device(&dev)
                    .unwrap();
                    let q_rows = g(&b.q.narrow(0, rows.start, rows.len()).unwrap());
                    let within = got.narrow(0, rows.start, rows.len()).unwrap();
                    for blocks in [AttentionBlocks::ByBatch, AttentionBlocks::HeadGroups] {
                        let single =
                            paged_attention_by(&q_rows, &g(&b.k), &g(&b.v), &alone, &params, gpu_sinks, blocks);
                        assert_eq!(
                            bits(&single.unwrap()),
                            bits(&within),
                            "{what}: rows {rows:?} alone, {blocks:?}"
                        );
                    }
                    alone
                };
                let alone = rows_alone(2, 25..26);
                rows_alone(4, 27..29);
                // A device copy of another size of batch is refused.
                let stale = AttentionMetadata {
                    device: alone.device.clone(),
                    ..b.meta.clone()
                };
                let err = paged_attention(&g(&b.q), &g(&b.k), &g(&b.v), &stale, &params, gpu_sinks).unwrap_err();
                assert!(
                    err.to_string().contains("the metadata's device copy holds"),
                    "{what}: {err}"
                );
            }
        }
    }
}

/// Keys and values into a cache's two halves, each row by its own slot and each half by its
/// own scale, with the CPU's bits: from f32 rows, from bf16 rows, and from column ranges of a
/// fused projection read in place.
#[test]
fn kv_write_rounds_exactly_as_the_cpu() {
    let Some(dev) = gpu() else { return };
    // A padding row's slot writes nothing, on both.
    let slots = AttentionMetadata {
        slot_mapping: vec![5, PAD_SLOT, 17, 3],
        ..Default::default()
    };
    let gpu_slots = slots.clone().on_device(&dev).unwrap();
    // Up to ±4000 / 8 = ±500: FP8 saturates some, as on the CPU.
    let (k, v) = (tensor((4, 96), 12, 4000.0), tensor((4, 96), 15, 300.0));
    let on_gpu = |t: &Tensor| t.to_device(&dev).unwrap();
    for (dtype, scale) in [
        (DType::F32, KvScale::ONE),
        (DType::BF16, KvScale::ONE),
        (DType::F8E4M3, KvScale { k: 8.0, v: 0.5 }),
        (DType::F8E4M3, KvScale::ONE),
    ] {
        let what = format!("{dtype:?} cache, scales {scale:?}");
        let zeros = |dev: &Device| Tensor::zeros((2, 20, 96), dtype, dev).unwrap();
        let cpu = zeros(&Device::Cpu);
        write_kv(&cpu, &k, &v, &slots, scale).unwrap();
        let gpu_cache = zeros(&dev);
        write_kv(&gpu_cache, &on_gpu(&k), &on_gpu(&v), &gpu_slots, scale).unwrap();
        assert_eq!(bits(&gpu_cache), bits(&cpu), "{what}");
        // bf16 rows into the cache.
        let bf16 = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
        let f32 = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
        let gpu_cache = zeros(&dev);
        write_kv(&gpu_cache, &on_gpu(&bf16(&k)), &on_gpu(&bf16(&v)), &gpu_slots, scale).unwrap();
        let cpu = zeros(&Device::Cpu);
        write_kv(&cpu, &f32(&bf16(&k)), &f32(&bf16(&v)), &slots, scale).unwrap();
        assert_eq!(bits(&gpu_cache), bits(&cpu), "bf16 rows into a {what}");
        // Keys and values read in place from column ranges of one wider tensor (a fused
        // projection's), on both.
        let wide = Tensor::cat(&[&tensor((4, 40), 13, 1.0), &k, &v, &tensor((4, 8), 14, 1.0)], 1).unwrap();
        let columns = |wide: &Tensor| (wide.narrow(1, 40, 96).unwrap(), wide.narrow(1, 136, 96).unwrap());
        let gpu_cache = zeros(&dev);
        let (gk, gv) = columns(&on_gpu(&wide));
        write_kv(&gpu_cache, &gk, &gv, &gpu_slots, scale).unwrap();
        let cpu = zeros(&Device::Cpu);
        let (ck, cv) = columns(&wide);
        write_kv(&cpu, &ck, &cv, &slots, scale).unwrap();
        let want = zeros(&Device::Cpu);
        write_kv(&want, &k, &v, &slots, scale).unwrap();
        assert_eq!(bits(&cpu), bits(&want), "strided rows on the CPU, {what}");
        assert_eq!(bits(&gpu_cache), bits(&want), "strided rows, {what}");
    }
    let cache = Tensor::zeros((2, 20, 96), DType::F32, &dev).unwrap();
    let (gk, gv) = (on_gpu(&k), on_gpu(&v));
    let outside = AttentionMetadata {
        slot_mapping: vec![1, 2, 3, 20],
        ..Default::default()
    }
    .on_device(&dev)
    .unwrap();
    let err = write_kv(&cache, &gk, &gv, &outside, KvScale::ONE).unwrap_err();
    assert!(err.to_string().contains("slot 20 outside"), "{err}");
    // Metadata made for the host has no device copy for the kernel to read.
    let err = write_kv(&cache, &gk, &gv, &slots, KvScale::ONE).unwrap_err();
    assert!(err.to_string().contains("no device copy"), "{err}");
    // A device copy of another batch's slots, fewer than the rows, is refused.
    let stale = AttentionMetadata {
        slot_mapping: vec![5, 6, 7, 8],
        device: AttentionMetadata {
            slot_mapping: vec![5, 6],
            ..Default::default()
        }
        .on_device(&dev)
        .unwrap()
        .device,
        ..Default::default()
    };
    let err = write_kv(&cache, &gk, &gv, &stale, KvScale::ONE).unwrap_err();
    assert!(err.to_string().contains("2 device slots for 4 rows"), "{err}");
}

/// Rotary tables [2, rows, head_dim / 2] for positions 3, 10, 17, ... (angles well past 2π).
fn rotary_tables(rows: usize, head_dim: usize) -> Tensor {
    let half = head_dim / 2;
    let angle = |r: usize, j: usize| (3 + 7 * r) as f32 * 10000f32.powf(-2.0 * j as f32 / head_dim as f32);
    let cos = (0..rows).flat_map(|r| (0..half).map(move |j| angle(r, j).cos()));
    let sin = (0..rows).flat_map(|r| (0..half).map(move |j| angle(r, j).sin()));
    Tensor::from_vec(cos.chain(sin).collect::<Vec<f32>>(), (2, rows, half), &Device::Cpu).unwrap()
}

/// The KV write and attention that rotate what they read give the bits of `rope` first, then
/// the plain kernels: on the GPU, for f32 and bf16 rows read in place from a fused
/// projection's columns, into f32, bf16 and FP8 caches; and the CPU's where the rows are f32.
/// Misshapen tables are refused.
#[test]
fn rotating_kv_write_and_attention_equal_rope_first() {
    let Some(dev) = gpu() else { return };
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    let params = AttentionParams {
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 64,
        scale: 0.125,
        sliding_window: None,
        kv_scale: KvScale::ONE,
    };
    let (q_width, kv_width) = (8 * 64, 2 * 64);
    let b = batch(&[(40, 17), (9, 1), (300, 8)], params, 21);
    let rows = b.meta.num_rows();
    let gpu_meta = b.meta.clone().on_device(&dev).unwrap();
    let tables = rotary_tables(rows, 64);
    let gpu_tables = g(&tables);
    let rotation = Rotation {
        tables: &tables,
        table_rows: None,
        head_dim: 64,
    };
    let gpu_rotation = Rotation {
        tables: &gpu_tables,
        table_rows: None,
        head_dim: 64,
    };
    // A fused projection's output: queries, keys and values side by side.
    let qkv = tensor((rows, q_width + 2 * kv_width), 22, 2.0);
    let columns = |qkv: &Tensor, at: usize, width: usize| qkv.narrow(1, at, width).unwrap();
    for dtype in [DType::F32, DType::BF16] {
        let qkv_gpu = g(&qkv.to_dtype(dtype).unwrap());
        let (q, k, v) = (
            columns(&qkv_gpu, 0, q_width),
            columns(&qkv_gpu, q_width, kv_width),
            columns(&qkv_gpu, q_width + kv_width, kv_width),
        );
        for (cache_dtype, scale) in [
            (DType::F32, KvScale::ONE),
            (DType::BF16, KvScale::ONE),
            (DType::F8E4M3, KvScale { k: 0.5, v: 0.25 }),
        ] {
            let what = format!("{dtype:?} rows, {cache_dtype:?} cache");
            let fresh = || {
                let both = Tensor::zeros((2, b.k.dim(0).unwrap(), kv_width), cache_dtype, &dev).unwrap();
                both.slice_set(&g(&b.k.to_dtype(cache_dtype).unwrap()).unsqueeze(0).unwrap(), 0, 0)
                    .unwrap();
                both.slice_set(&g(&b.v.to_dtype(cache_dtype).unwrap()).unsqueeze(0).unwrap(), 0, 1)
                    .unwrap();
                both
            };
            let (fused, separate) = (fresh(), fresh());
            write_rotated_kv(&fused, &k, &v, &gpu_meta, scale, gpu_rotation).unwrap();
            write_kv(&separate, &gpu_rotation.apply(&k).unwrap(), &v, &gpu_meta, scale).unwrap();
            assert_eq!(bits(&fused), bits(&separate), "{what}: the cache");
            let p = AttentionParams {
                kv_scale: scale,
                ..params
            };
            let half = |t: &Tensor, i| t.get(i).unwrap();
            let got = rotated_paged_attention(
                &q,
                &half(&fused, 0),
                &half(&fused, 1),
                &gpu_meta,
                &p,
                None,
                gpu_rotation,
            )
            .unwrap();
            let rotated_q = gpu_rotation.apply(&q).unwrap();
            let want = paged_attention(
                &rotated_q,
                &half(&separate, 0),
                &half(&separate, 1),
                &gpu_meta,
                &p,
                None,
            )
            .unwrap();
            assert_eq!(bits(&got), bits(&want), "{what}: attention");
            if dtype == DType::F32 {
                let cpu = Tensor::zeros((2, b.k.dim(0).unwrap(), kv_width), cache_dtype, &Device::Cpu).unwrap();
                cpu.slice_set(&b.k.to_dtype(cache_dtype).unwrap().unsqueeze(0).unwrap(), 0, 0)
                    .unwrap();
                cpu.slice_set(&b.v.to_dtype(cache_dtype).unwrap().unsqueeze(0).unwrap(), 0, 1)
                    .unwrap();
                let (cq, ck, cv) = (
                    columns(&qkv, 0, q_width),
                    columns(&qkv, q_width, kv_width),
                    columns(&qkv, q_width + kv_width, kv_width),
                );
                write_rotated_kv(&cpu, &ck, &cv, &b.meta, scale, rotation).unwrap();
                assert_eq!(bits(&fused), bits(&cpu), "{what}: the cache against the CPU's");
                let on_cpu =
                    rotated_paged_attention(&cq, &half(&cpu, 0), &half(&cpu, 1), &b.meta, &p, None, rotation).unwrap();
                let diff = max_rel_diff(&host(&got), &host(&on_cpu));
                assert!(diff < 1e-5, "{what}: attention against the CPU's, off by {diff}");
            }
        }
    }
    by_table_rows_equals_own_tables(&b, &gpu_meta, &qkv, params, &tables);
    // Tables of another batch's rows are refused.
    let short = g(&rotary_tables(rows - 1, 64));
    let wrong = Rotation {
        tables: &short,
        table_rows: None,
        head_dim: 64,
    };
    let q = g(&tensor((rows, q_width), 23, 1.0));
    let both = Tensor::zeros((2, b.k.dim(0).unwrap(), kv_width), DType::F32, &dev).unwrap();
    let kv = g(&tensor((rows, kv_width), 24, 1.0));
    let err = write_rotated_kv(&both, &kv, &kv, &gpu_meta, KvScale::ONE, wrong).unwrap_err();
    assert!(err.to_string().contains("rotary tables"), "{err}");
    let err = rotated_paged_attention(
        &q,
        &both.get(0).unwrap(),
        &both.get(1).unwrap(),
        &gpu_meta,
        &params,
        None,
        wrong,
    )
    .unwrap_err();
    assert!(err.to_string().contains("rotary tables"), "{err}");
}

/// The rows' tables read from a larger table by each row's index into it (a table of every
/// position read by the rows' positions) give the bits of the rows' own tables, in the KV
/// write and in attention; indices of another batch's rows are refused.
fn by_table_rows_equals_own_tables(
    b: &Batch,
    gpu_meta: &AttentionMetadata,
    qkv: &Tensor,
    params: AttentionParams,
    own: &Tensor,
) {
    let dev = gpu_meta.device.as_ref().unwrap().packed.device().clone();
    let g = |t: &Tensor| t.to_device(&dev).unwrap();
    let rows = b.meta.num_rows();
    // Row r's tables at row 3 r + 2 of a table of 3 rows + 2, the rows between them others'.
    let table_rows: Vec<u32> = (0..rows as u32).map(|r| 3 * r + 2).collect();
    let mut table = rotary_tables(3 * rows + 2, 64).to_vec3::<f32>().unwrap();
    for (half, own_half) in table.iter_mut().zip(own.to_vec3::<f32>().unwrap()) {
        for (&at, row) in table_rows.iter().zip(own_half) {
            half[at as usize] = row;
        }
    }
    let table = Tensor::new(table, &Device::Cpu).unwrap();
    let (gpu_own, gpu_table) = (g(own), g(&table));
    let gpu_rows = g(&Tensor::new(table_rows.as_slice(), &Device::Cpu).unwrap());
    let by_rows = Rotation {
        tables: &gpu_table,
        table_rows: Some(&gpu_rows),
        head_dim: 64,
    };
    let own = Rotation {
        tables: &gpu_own,
        table_rows: None,
        head_dim: 64,
    };
    let (q_width, kv_width) = (8 * 64, 2 * 64);
    let qkv = g(&qkv.to_dtype(DType::BF16).unwrap());
    let (q, k, v) = (
        qkv.narrow(1, 0, q_width).unwrap(),
        qkv.narrow(1, q_width, kv_width).unwrap(),
        qkv.narrow(1, q_width + kv_width, kv_width).unwrap(),
    );
    let fresh = || {
        let both = Tensor::zeros((2, b.k.dim(0).unwrap(), kv_width), DType::BF16, &dev).unwrap();
        both.slice_set(&g(&b.k.to_dtype(DType::BF16).unwrap()).unsqueeze(0).unwrap(), 0, 0)
            .unwrap();
        both.slice_set(&g(&b.v.to_dtype(DType::BF16).unwrap()).unsqueeze(0).unwrap(), 0, 1)
            .unwrap();
        both
    };
    let (read, kept) = (fresh(), fresh());
    write_rotated_kv(&read, &k, &v, gpu_meta, KvScale::ONE, by_rows).unwrap();
    write_rotated_kv(&kept, &k, &v, gpu_meta, KvScale::ONE, own).unwrap();
    assert_eq!(bits(&read), bits(&kept), "the cache, by table rows");
    let attend = |cache: &Tensor, rotation| {
        let (kc, vc) = (cache.get(0).unwrap(), cache.get(1).unwrap());
        rotated_paged_attention(&q, &kc, &vc, gpu_meta, &params, None, rotation).unwrap()
    };
    assert_eq!(
        bits(&attend(&read, by_rows)),
        bits(&attend(&kept, own)),
        "attention, by table rows"
    );
    let too_few = g(&Tensor::new(&table_rows[1..], &Device::Cpu).unwrap());
    let wrong = Rotation {
        table_rows: Some(&too_few),
        ..by_rows
    };
    let err = write_rotated_kv(&read, &k, &v, gpu_meta, KvScale::ONE, wrong).unwrap_err();
    assert!(err.to_string().contains("rotary table rows"), "{err}");
}

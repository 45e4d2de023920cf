use super::module::{function, Kernel, Module};
use super::split_counters::{resident_blocks, with_split};
use super::{
    arg_or_null, by_dtypes_or_fp8, dtype_name, dtype_name_or_fp8, int, output, starts_aligned_16, strided_view, view,
    with_optional_view, with_view,
};
use crate::attention_blocks::{Cover, MAX_SPLITS};
use crate::attention_metadata::AttentionMetadata;
use crate::error::bad_input;
use crate::kernel_constants::{ATTN_MAX_HEAD_DIM, ATTN_WARPS};
use crate::paged_attention::{AttentionBlocks, AttentionParams, Sinks};
use crate::rope::Rotation;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape};

/// Threads per block, and the largest head.
const THREADS: u32 = 32 * ATTN_WARPS as u32;
const MAX_HEAD_DIM: usize = ATTN_MAX_HEAD_DIM;

/// What attention reads beside its queries and the cache.
pub(crate) struct AttentionInputs<'a> {
    pub meta: &'a AttentionMetadata,
    pub params: &'a AttentionParams,
    pub sinks: Option<&'a Sinks>,
    /// The queries' rotation, its tables checked, where the kernel rotates them.
    pub rotation: Option<Rotation<'a>>,
    pub blocks: AttentionBlocks,
}

/// `kernels/paged_attention.cu` over a batch whose metadata was validated against the cache,
/// reading the metadata's and the sinks' device copies.
pub(crate) fn paged_attention(
    q: (&CudaStorage, &Layout),
    k_cache: (&CudaStorage, &Layout),
    v_cache: (&CudaStorage, &Layout),
    inputs: &AttentionInputs,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "paged_attention";
    let (meta, params) = (inputs.meta, inputs.params);
    if params.head_dim > MAX_HEAD_DIM {
        return Err(bad_input(
            OP,
            format!("head_dim {} is over the CUDA kernel's {MAX_HEAD_DIM}", params.head_dim),
        ));
    }
    if k_cache.0.dtype() != v_cache.0.dtype() {
        return Err(bad_input(OP, "the key and value caches differ in dtype"));
    }
    let packed = &meta
        .device
        .as_ref()
        .ok_or_else(|| bad_input(OP, "the metadata has no device copy: AttentionMetadata::on_device"))?
        .packed;
    // The kernel reads the device copy; the host's was validated. They must be one batch's,
    // which a copy of another size cannot be (one of this size is trusted to be).
    if packed.dims1()? != meta.packed_len() {
        return Err(bad_input(
            OP,
            format!(
                "the metadata's device copy holds {} values, this batch's {}",
                packed.dims1()?,
                meta.packed_len()
            ),
        ));
    }
    let sinks = inputs
        .sinks
        .map(|s| {
            s.on_device()
                .ok_or_else(|| bad_input(OP, "the sinks have no device copy: Sinks::new for the GPU"))
        })
        .transpose()?;
    let device = q.0.device.clone();
    let (q_dtype, cache_dtype) = (q.0.dtype(), k_cache.0.dtype());
    let cover = Cover::of(meta, params, inputs.blocks, resident_blocks(&device)?);
    let name = format!(
        "paged_attention_{}{}_{}",
        if cover.head_group > 1 { "heads_" } else { "" },
        dtype_name(OP, q_dtype)?,
        dtype_name_or_fp8(OP, cache_dtype)?
    );
    let rows = meta.num_rows();
    let width = params.num_heads * params.head_dim;
    let args = Args {
        func: function(&device, Module::PagedAttention, &name)?,
        out: (rows, width),
        ints: [
            int(OP, rows)?,
            int(OP, meta.num_sequences())?,
            int(OP, params.num_heads)?,
            int(OP, params.num_kv_heads)?,
            int(OP, params.head_dim)?,
            int(OP, meta.block_size)?,
        ],
        scale: params.scale * params.kv_scale.k,
        v_scale: params.kv_scale.v,
        window: int(OP, params.sliding_window.unwrap_or(0))?,
        // Every key row then starts on a 16-byte boundary (8 for FP8), as 8-element loads need.
        vector_keys: i32::from(params.head_dim.is_multiple_of(8) && starts_aligned_16(k_cache.1, cache_dtype)),
        head_group: int(OP, cover.head_group)?,
    };
    let tables = inputs.rotation.map(|r| r.tables);
    let table_rows = inputs.rotation.and_then(|r| r.table_rows);
    let table_len = int(OP, tables.map_or(Ok(0), |t| t.dim(1))?)?;
    let out = with_view::<u32, _>(packed, "attention metadata", |meta| {
        with_optional_view::<f32, _>(sinks, "sinks", |sinks| {
            with_optional_view::<f32, _>(tables, "rotary tables", |tables| {
                with_optional_view::<u32, _>(table_rows, "rotary table rows", |table_rows| {
                    let reads = Reads {
                        meta: &meta,
                        sinks: sinks.as_ref(),
                        tables: tables.as_ref(),
                        table_rows: table_rows.as_ref(),
                        table_len,
                    };
                    with_split(&device, inputs.meta, params, &cover, |blocks, counters| {
                        let split = Split { blocks, counters };
                        by_dtypes_or_fp8!(
                            OP,
                            (q_dtype, cache_dtype),
                            launch(&device, q, k_cache, v_cache, &reads, &args, split)
                        )
                    })
                })
            })
        })
    })?;
    Ok((out, Shape::from((rows, width))))
}

struct Args {
    func: Kernel,
    out: (usize, usize),
    /// rows, seqs, num_heads, num_kv_heads, head_dim, block_size.
    ints: [i32; 6],
    /// The score's scale, the key cache's included.
    scale: f32,
    v_scale: f32,
    window: i32,
    /// Whether the kernel reads keys 8 elements a load.
    vector_keys: i32,
    /// The query heads of one KV head a block serves at one row (`paged_attention_heads_*`),
    /// or 1 (`paged_attention_*`: rows of a sequence may share a block).
    head_group: i32,
}

/// The device buffers the kernel reads beside the queries and the cache; null where absent.
struct Reads<'a> {
    meta: &'a CudaView<'a, u32>,
    sinks: Option<&'a CudaView<'a, f32>>,
    tables: Option<&'a CudaView<'a, f32>>,
    /// The table row of each query row; none: its own.
    table_rows: Option<&'a CudaView<'a, u32>>,
    /// The tables' rows.
    table_len: i32,
}

/// The blocks that share each row's parts of the keys, and the counters they need where more
/// than one do.
struct Split<'a> {
    blocks: usize,
    counters: Option<&'a mut CudaSlice<u32>>,
}

fn launch<T: CudaDType + DeviceRepr, C: CudaDType>(
    device: &CudaDevice,
    q: (&CudaStorage, &Layout),
    k_cache: (&CudaStorage, &Layout),
    v_cache: (&CudaStorage, &Layout),
    reads: &Reads,
    a: &Args,
    split: Split,
) -> Result<CudaStorage> {
    let (rows, width) = a.out;
    let mut out = output::<T>(device, rows * width)?;
    if rows == 0 {
        // CUDA refuses a launch over no blocks.
        return Ok(CudaStorage::wrap_cuda_slice(out, device.clone()));
    }
    let (q, q_stride) = strided_view::<T>(q.0, q.1, "paged_attention", "the queries")?;
    let k = view::<C>(k_cache.0, k_cache.1, "key cache")?;
    let v = view::<C>(v_cache.0, v_cache.1, "value cache")?;
    let null: u64 = 0;
    let mut partials = None;
    let mut builder = a.func.builder();
    builder.arg(&mut out).arg(&q).arg(&k).arg(&v).arg(reads.meta);
    arg_or_null(&mut builder, reads.sinks);
    arg_or_null(&mut builder, reads.tables);
    arg_or_null(&mut builder, reads.table_rows);
    builder.arg(&reads.table_len);
    match split.counters {
        Some(counters) => {
            // Each part's partial softmax of each (row, head): its largest logit, its
            // denominator and its sums.
            let (heads, head_dim) = (a.ints[2] as usize, a.ints[4] as usize);
            let len = rows * heads * MAX_SPLITS * (head_dim + 2);
            builder.arg(partials.insert(output::<f32>(device, len)?)).arg(counters)
        }
        None => builder.arg(&null).arg(&null),
    };
    for i in &a.ints {
        builder.arg(i);
    }
    builder
        .arg(&q_stride)
        .arg(&a.scale)
        .arg(&a.v_scale)
        .arg(&a.window)
        .arg(&a.vector_keys)
        .arg(&a.head_group);
    let config = LaunchConfig {
        grid_dim: (a.ints[0] as u32, (a.ints[2] / a.head_group) as u32, split.blocks as u32),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the metadata was validated against the cache (every block in range, every
    // sequence's table long enough), the shapes against the head layout, the rotary tables as
    // the KV write's are (each table row read as at most the last). Where blocks share
    // parts, the partials hold every (row, head, part) and the counters every (row, head).
    unsafe { builder.launch(config) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

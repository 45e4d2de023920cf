use super::module::{function, Kernel, Module};
use super::uploads::{uploaded, Upload};
use super::{by_dtypes_or_fp8, dtype_name, dtype_name_or_fp8, int, output, view};
use crate::error::bad_input;
use crate::paged_attention::{AttentionMetadata, AttentionParams};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Result, Shape};
use std::sync::Arc;

/// Threads per block and the largest head, as `kernels/paged_attention.cu` has them.
const THREADS: u32 = 128;
const MAX_HEAD_DIM: usize = 256;

/// `kernels/paged_attention.cu` over a batch whose metadata was validated against the cache.
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention(
    q: (&CudaStorage, &Layout),
    k_cache: (&CudaStorage, &Layout),
    v_cache: (&CudaStorage, &Layout),
    meta: &AttentionMetadata,
    params: &AttentionParams,
    sinks: Option<&[f32]>,
) -> Result<(CudaStorage, Shape)> {
    const OP: &str = "paged_attention";
    if params.head_dim > MAX_HEAD_DIM {
        return Err(bad_input(
            OP,
            format!("head_dim {} is over the CUDA kernel's {MAX_HEAD_DIM}", params.head_dim),
        ));
    }
    if k_cache.0.dtype() != v_cache.0.dtype() {
        return Err(bad_input(OP, "the key and value caches differ in dtype"));
    }
    let device = q.0.device.clone();
    let (q_dtype, cache_dtype) = (q.0.dtype(), k_cache.0.dtype());
    let name = format!(
        "paged_attention_{}_{}",
        dtype_name(OP, q_dtype)?,
        dtype_name_or_fp8(OP, cache_dtype)?
    );
    let rows = meta.num_rows();
    let width = params.num_heads * params.head_dim;
    let args = Args {
        func: function(&device, Module::PagedAttention, &name)?,
        meta: uploaded(&device, Upload::AttentionMetadata, &packed(meta))?,
        sinks: sinks
            .map(|s| {
                uploaded(
                    &device,
                    Upload::Sinks,
                    &s.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                )
            })
            .transpose()?,
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
    };
    let out = by_dtypes_or_fp8!(OP, (q_dtype, cache_dtype), launch(&device, q, k_cache, v_cache, &args))?;
    Ok((out, Shape::from((rows, width))))
}

struct Args {
    func: Kernel,
    meta: Arc<CudaSlice<u32>>,
    /// The sinks' f32 bits: the kernel reads them as floats.
    sinks: Option<Arc<CudaSlice<u32>>>,
    out: (usize, usize),
    /// rows, seqs, num_heads, num_kv_heads, head_dim, block_size.
    ints: [i32; 6],
    /// The score's scale, the key cache's included.
    scale: f32,
    v_scale: f32,
    window: i32,
}

/// The kernel's `meta`: each row's sequence, each row's position, each sequence's offset into
/// the block tables, then the tables.
fn packed(meta: &AttentionMetadata) -> Vec<u32> {
    let (rows, seqs) = (meta.num_rows(), meta.num_sequences());
    let tables: usize = meta.block_tables.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(2 * rows + seqs + tables);
    for (s, w) in meta.query_start.windows(2).enumerate() {
        out.extend((w[0]..w[1]).map(|_| s as u32));
    }
    for (s, w) in meta.query_start.windows(2).enumerate() {
        let q = w[1] - w[0];
        out.extend((0..q).map(|i| (meta.context_lens[s] - q + i) as u32));
    }
    let mut offset = 0;
    for table in &meta.block_tables {
        out.push(offset as u32);
        offset += table.len();
    }
    for table in &meta.block_tables {
        out.extend_from_slice(table);
    }
    out
}

fn launch<T: CudaDType + DeviceRepr, C: CudaDType>(
    device: &CudaDevice,
    q: (&CudaStorage, &Layout),
    k_cache: (&CudaStorage, &Layout),
    v_cache: (&CudaStorage, &Layout),
    a: &Args,
) -> Result<CudaStorage> {
    let (rows, width) = a.out;
    let mut out = output::<T>(device, rows * width)?;
    let q = view::<T>(q.0, q.1, "queries")?;
    let k = view::<C>(k_cache.0, k_cache.1, "key cache")?;
    let v = view::<C>(v_cache.0, v_cache.1, "value cache")?;
    let null: u64 = 0;
    let mut builder = a.func.builder();
    builder.arg(&mut out).arg(&q).arg(&k).arg(&v).arg(a.meta.as_ref());
    match &a.sinks {
        Some(s) => builder.arg(s.as_ref()),
        None => builder.arg(&null),
    };
    for i in &a.ints {
        builder.arg(i);
    }
    builder.arg(&a.scale).arg(&a.v_scale).arg(&a.window);
    let config = LaunchConfig {
        grid_dim: (a.ints[0] as u32, a.ints[2] as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the metadata was validated against the cache (every block in range, every
    // sequence's table long enough), the shapes against the head layout.
    unsafe { builder.launch(config) }.w()?;
    Ok(CudaStorage::wrap_cuda_slice(out, device.clone()))
}

//! Compute ops that candle lacks, written for batch invariance: every output row is computed by
//! the same sequence of floating-point operations whatever else is in the batch. Speculative
//! verification of K+1 rows therefore reproduces K+1 single-token decode steps bit for bit.

mod argmax_rows;
#[cfg(any(feature = "cuda", test))]
mod attention_blocks;
mod attention_metadata;
mod cache_element;
mod chain_drafts;
mod contiguous;
#[cfg(feature = "cuda")]
mod cuda;
mod cuda_matmul;
mod cuda_profiler;
#[cfg(feature = "cuda")]
mod dense_experts;
mod dequantized_linear;
mod device_memory;
mod dot;
mod error;
mod exp;
#[cfg(feature = "cuda")]
mod experts;
mod fp8_weight;
mod gather_rows;
mod gpus;
mod gumbel_sample;
mod head_rows;
mod indices;
mod invariant_matmul;
mod isa;
/// The kernels' shapes and limits: each `#define` of `kernels/` with one decimal value, written
/// as Rust by build.rs. The launchers read a kernel's block size, tiles and limits from here,
/// not from copies of their own. The host needs only some of them.
#[allow(dead_code)]
mod kernel_constants {
    include!(concat!(env!("OUT_DIR"), "/kernel_constants.rs"));
}
mod kv_write;
mod linear;
mod masked_softmax;
mod mxfp4;
mod mxfp4_dequant;
#[cfg(feature = "cuda")]
mod mxfp4_experts;
mod no_rows;
mod paged_attention;
mod panel_tile;
mod pool;
mod requested_rows;
mod rms_norm;
mod rope;
mod row_candidates;
mod swiglu;
mod take_ids;
#[cfg(test)]
mod test_util;
mod token_mask;
mod upload;
mod value_sum;

pub use argmax_rows::{argmax_each_row, argmax_rows, issue_argmax_rows};
pub use attention_metadata::{AttentionMetadata, DeviceMetadata};
pub use cache_element::CacheElement;
pub use chain_drafts::{chain_drafts, LastPass};
pub use cuda_matmul::{CudaMatmul, MmaTiles, CUDA_MATMUL_ENV};
pub use cuda_profiler::cuda_profiler_range;
#[cfg(feature = "cuda")]
pub use dense_experts::{DenseExpert, DenseExperts, ExpertMatrix};
pub use device_memory::{device_memory, peak_allocated, DeviceMemory};
pub use error::KernelError;
pub use exp::exp_in_place;
#[cfg(feature = "cuda")]
pub use experts::{ExpertOutputs, Routing};
pub use fp8_weight::{fp8_linear, fp8_linear_tiled, Fp8Weight};
pub use gather_rows::{gather_rows, gather_rows_into};
pub use gpus::{cuda_devices, open_cuda};
pub use gumbel_sample::{gumbel_sample, issue_gumbel_sample, splitmix64, GumbelRequest};
pub use indices::Indices;
pub use invariant_matmul::{
    invariant_linear, invariant_linear_swiglu, invariant_matmul, invariant_matmul_by, invariant_matmul_tiled,
};
pub use kv_write::{write_kv, write_rotated_kv, PAD_SLOT};
pub use linear::{linear, PackedWeight};
pub use masked_softmax::masked_softmax;
pub use mxfp4::{mxfp4_linear, Mxfp4Weight, MXFP4_BLOCK};
#[cfg(feature = "cuda")]
pub use mxfp4_experts::{Mxfp4Expert, Mxfp4Experts};
pub use no_rows::no_rows;
pub use paged_attention::{
    paged_attention, paged_attention_by, rotated_paged_attention, AttentionBlocks, AttentionParams, KvScale, Sinks,
};
pub use pool::on_pool;
pub use requested_rows::Issued;
pub use rms_norm::{add_rms_norm, rms_norm, rms_norm_pair};
pub use rope::{rope, Rotation};
pub use row_candidates::{issue_row_candidates, row_candidates, CandidateRequest, RowCandidates, MAX_ROW_CANDIDATES};
pub use swiglu::{clamped_swiglu, swiglu};
pub use take_ids::{ids_to_write, pick_ids, take_ids};
pub use token_mask::{allows, mask_tokens, TOKEN_MASK_WORD_BITS};
pub use upload::upload_into;

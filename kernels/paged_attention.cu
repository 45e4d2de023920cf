// Causal attention of a flattened batch's query rows over the paged KV cache: decode rows,
// verification windows and prefill chunks alike, with GQA, an optional sliding window and an
// optional sink logit per query head. `scale` is the score's, the key cache's per-tensor scale
// included; `v_scale` the value cache's (both 1 but for FP8 caches).
//
// One block of ATTN_THREADS threads per (query row, query head). Keys are visited in tiles of
// ATTN_THREADS positions, in position order, with an online softmax; each output element is
// the same chain of operations whatever else the launch holds, so rows are batch invariant.
// A thread reads its key 8 elements a load where the launcher says the cache's rows allow it
// (`vector_keys`: head_dim % 8 == 0, the cache 16-byte aligned): each of the warp's loads then
// brings a whole sector of each of its 32 keys, where one element a load took eight times the
// loads for the same sectors. The loop over a tile's values is unrolled so that many of its
// loads are in flight at once (a decode row's block waits on little else). Neither moves the
// order of the sums.
//
// `q`'s rows are `q_stride` elements apart (a column range of a wider tensor), `out`'s
// num_heads * head_dim. Where `rotation` is not null, each query is rotated as it is read by its
// row's tables [2, rows, head_dim / 2] (cos, then sin): each element by rope.cu's arithmetic,
// rounded to T, as a launch of rope.cu would have written it.
//
// `meta` packs the batch's layout as u32: the sequence of each row [rows], the position of
// each row [rows], the offset of each sequence's block table [seqs], then the block tables.
#include "common.cuh"

#define ATTN_THREADS 128
#define ATTN_MAX_HEAD_DIM 256

template <typename T, typename C>
__device__ void paged_attention(T* out, const T* q, const C* k_cache, const C* v_cache,
                                const uint32_t* meta, const float* sinks, const float* rotation, int rows, int seqs,
                                int num_heads, int num_kv_heads, int head_dim, int block_size,
                                int q_stride, float scale, float v_scale, int window, int vector_keys) {
    __shared__ float q_s[ATTN_MAX_HEAD_DIM];
    __shared__ float weights[ATTN_THREADS];
    __shared__ uint32_t slots[ATTN_THREADS];
    __shared__ float scratch[32];

    const int row = blockIdx.x, head = blockIdx.y, tid = threadIdx.x;
    const int pos = (int)meta[rows + row];
    const uint32_t* table = meta + 2 * rows + seqs + meta[2 * rows + meta[row]];
    const int kv_head = head / (num_heads / num_kv_heads);
    const size_t kv_width = (size_t)num_kv_heads * head_dim;
    const size_t q_offset = (size_t)row * q_stride + (size_t)head * head_dim;
    const size_t out_offset = (size_t)row * num_heads * head_dim + (size_t)head * head_dim;

    const int half = head_dim / 2;
    for (int d = tid; d < head_dim; d += ATTN_THREADS) {
        if (!rotation) {
            q_s[d] = to_f32(q[q_offset + d]);
            continue;
        }
        const int j = d % half;
        const float c = rotation[(size_t)row * half + j], s = rotation[((size_t)rows + row) * half + j];
        const float a = to_f32(q[q_offset + j]), b = to_f32(q[q_offset + j + half]);
        const float r = d < half ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
        q_s[d] = to_f32(from_f32<T>(r));
    }
    __syncthreads();

    // The sink starts the running max and contributes exp(sink - m) = 1 to the denominator.
    float m = sinks ? sinks[head] : -INFINITY;
    float denom = sinks ? 1.f : 0.f;
    float acc0 = 0.f, acc1 = 0.f;
    const int first = window > 0 ? max(0, pos + 1 - window) : 0;
    for (int t0 = first; t0 <= pos; t0 += ATTN_THREADS) {
        const int n = min(ATTN_THREADS, pos + 1 - t0);
        float score = -INFINITY;
        if (tid < n) {
            const int p = t0 + tid;
            const uint32_t slot = table[p / block_size] * block_size + p % block_size;
            slots[tid] = slot;
            const C* key = k_cache + slot * kv_width + (size_t)kv_head * head_dim;
            float dot = 0.f;
            if (vector_keys) {
#pragma unroll 4
                for (int d0 = 0; d0 < head_dim; d0 += 8) {
                    float k8[8];
                    load8(key + d0, k8);
#pragma unroll
                    for (int j = 0; j < 8; ++j) dot = fmaf(q_s[d0 + j], k8[j], dot);
                }
            } else {
#pragma unroll 8
                for (int d = 0; d < head_dim; ++d) dot = fmaf(q_s[d], to_f32(key[d]), dot);
            }
            score = dot * scale;
        }
        const float m_new = fmaxf(m, block_max(score, scratch));
        const float rescale = expf(m - m_new);
        const float w = tid < n ? expf(score - m_new) : 0.f;
        weights[tid] = w;
        denom = denom * rescale + block_sum(w, scratch);
        acc0 *= rescale;
        acc1 *= rescale;
#pragma unroll 16
        for (int j = 0; j < n; ++j) {
            const C* value = v_cache + slots[j] * kv_width + (size_t)kv_head * head_dim;
            if (tid < head_dim) acc0 = fmaf(weights[j], to_f32(value[tid]), acc0);
            if (tid + ATTN_THREADS < head_dim) acc1 = fmaf(weights[j], to_f32(value[tid + ATTN_THREADS]), acc1);
        }
        m = m_new;
        __syncthreads();
    }
    if (tid < head_dim) out[out_offset + tid] = from_f32<T>(acc0 * v_scale / denom);
    if (tid + ATTN_THREADS < head_dim) out[out_offset + tid + ATTN_THREADS] = from_f32<T>(acc1 * v_scale / denom);
}

#define PAGED_ATTENTION(NAME, T, C)                                                            \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS) NAME(                          \
        T* out, const T* q, const C* k_cache, const C* v_cache, const uint32_t* meta,         \
        const float* sinks, const float* rotation, int rows, int seqs, int num_heads,          \
        int num_kv_heads, int head_dim, int block_size, int q_stride, float scale,             \
        float v_scale, int window, int vector_keys) {                                         \
        paged_attention<T, C>(out, q, k_cache, v_cache, meta, sinks, rotation, rows, seqs, num_heads, \
                              num_kv_heads, head_dim, block_size, q_stride, scale, v_scale,   \
                              window, vector_keys);                                           \
    }

PAGED_ATTENTION(paged_attention_f32_f32, float, float)
PAGED_ATTENTION(paged_attention_f32_bf16, float, __nv_bfloat16)
PAGED_ATTENTION(paged_attention_bf16_f32, __nv_bfloat16, float)
PAGED_ATTENTION(paged_attention_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
PAGED_ATTENTION(paged_attention_f32_f8e4m3, float, __nv_fp8_e4m3)
PAGED_ATTENTION(paged_attention_bf16_f8e4m3, __nv_bfloat16, __nv_fp8_e4m3)

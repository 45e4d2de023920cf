// Causal attention of a flattened batch's query rows over the paged KV cache: decode rows,
// verification windows and prefill chunks alike, with GQA, an optional sliding window and an
// optional sink logit per query head. `scale` is the score's, the key cache's per-tensor scale
// included; `v_scale` the value cache's (both 1 but for FP8 caches).
//
// One block of ATTN_WARPS warps per (query row, query head). The row's keys, from the first in
// its window to its own position, are cut into tiles of 32 positions; warp w takes tiles w,
// w + ATTN_WARPS, ... and keeps its own online softmax over them: a lane scores one key of the
// tile, and then sums the tile's values for its own dimensions (lane, lane + 32, ...), key by
// key in position order. At the end the warps' partial softmaxes are merged in warp order, the
// sink as one more logit of the denominator. A tile's work is thus one round of key loads and
// one of value loads, all in flight at once, with no barrier of the block between tiles, so a
// long context is walked by all the warps together rather than tile after tile.
//
// Batch invariance: the tiles, the warp that takes each and the merge depend only on the row's
// own window and position, so each output element is the same chain of operations whatever
// else the launch holds.
//
// A lane reads its key 8 elements a load where the launcher says the cache's rows allow it
// (`vector_keys`: head_dim % 8 == 0, the cache 16-byte aligned): each of the warp's loads then
// brings a whole sector of each of its 32 keys. Neither that nor the unrolling of the value
// loop (ATTN_TILE / DIMS keys at once, so about 32 loads of a lane are in flight) moves the
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

#define ATTN_WARPS 8
#define ATTN_THREADS (ATTN_WARPS * 32)
#define ATTN_TILE 32
#define ATTN_MAX_HEAD_DIM 256

// What a block shares: its query, each warp's tile weights and slots, and each warp's partial
// softmax for the merge.
struct AttentionShared {
    float q[ATTN_MAX_HEAD_DIM];
    float weights[ATTN_WARPS][ATTN_TILE];
    uint32_t slots[ATTN_WARPS][ATTN_TILE];
    float acc[ATTN_WARPS][ATTN_MAX_HEAD_DIM];
    float max[ATTN_WARPS];
    float denom[ATTN_WARPS];
};

// The cache slot of a tile's key for this lane: position t0 + lane, or, for a lane past the
// row's position `pos`, the tile's first (which the value loop reads with weight 0). t0 <= pos.
__device__ __forceinline__ uint32_t tile_slot(const uint32_t* table, int t0, int pos, int block_size) {
    const int lane = threadIdx.x % 32;
    const int p = t0 + lane <= pos ? t0 + lane : t0;
    return table[p / block_size] * block_size + p % block_size;
}

// One warp's online softmax over its tiles. DIMS is the dimensions a lane sums (head_dim <=
// 32 * DIMS); `acc[i]` is dimension lane + 32 i. `m` is the largest score seen, `denom` the
// lane's share of the denominator (its keys' weights).
template <typename C, int DIMS>
__device__ void warp_tiles(AttentionShared& s, const C* k_cache, const C* v_cache, const uint32_t* table, int first,
                           int pos, size_t kv_width, size_t kv_offset, int head_dim, int block_size, float scale,
                           int vector_keys, float& m, float& denom, float (&acc)[DIMS]) {
    constexpr int keys_at_once = ATTN_TILE / DIMS;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int t0 = first + warp * ATTN_TILE;
    uint32_t slot = t0 <= pos ? tile_slot(table, t0, pos, block_size) : 0;
    for (; t0 <= pos; t0 += ATTN_WARPS * ATTN_TILE) {
        const int n = min(ATTN_TILE, pos + 1 - t0);
        // The warp's next tile's slots, read first, so that the table's load overlaps this
        // tile rather than delaying the next tile's keys.
        const int next = t0 + ATTN_WARPS * ATTN_TILE;
        const uint32_t next_slot = next <= pos ? tile_slot(table, next, pos, block_size) : 0;
        float score = -INFINITY;
        if (lane < n) {
            const C* key = k_cache + slot * kv_width + kv_offset;
            float dot = 0.f;
            if (vector_keys) {
                // Bounded by DIMS rather than head_dim, so that unrolling leaves no remainder loop.
#pragma unroll 8
                for (int d0 = 0; d0 < 32 * DIMS; d0 += 8) {
                    if (d0 >= head_dim) break;
                    float k8[8];
                    load8(key + d0, k8);
#pragma unroll
                    for (int j = 0; j < 8; ++j) dot = fmaf(s.q[d0 + j], k8[j], dot);
                }
            } else {
                // Heads of no multiple of 8 elements, or an unaligned cache: rare, kept short.
#pragma unroll 1
                for (int d = 0; d < head_dim; ++d) dot = fmaf(s.q[d], to_f32(key[d]), dot);
            }
            score = dot * scale;
        }
        const float m_new = fmaxf(m, warp_reduce(score, Max()));
        const float rescale = expf(m - m_new);
        const float w = lane < n ? expf(score - m_new) : 0.f;
        denom = denom * rescale + w;
        s.weights[warp][lane] = w;
        s.slots[warp][lane] = slot;
        __syncwarp();
#pragma unroll
        for (int i = 0; i < DIMS; ++i) acc[i] *= rescale;
        // Over the whole tile, so that unrolling leaves no remainder loop: a key past the row's
        // position adds 0 * (a cached value) to each sum, which leaves it as it is.
#pragma unroll keys_at_once
        for (int j = 0; j < ATTN_TILE; ++j) {
            const float wj = s.weights[warp][j];
            const C* value = v_cache + s.slots[warp][j] * kv_width + kv_offset;
#pragma unroll
            for (int i = 0; i < DIMS; ++i) {
                const int d = lane + 32 * i;
                if (d < head_dim) acc[i] = fmaf(wj, to_f32(value[d]), acc[i]);
            }
        }
        m = m_new;
        slot = next_slot;
        // The next tile overwrites the weights and slots this one's lanes read.
        __syncwarp();
    }
}

template <typename T, typename C, int DIMS>
__device__ void paged_attention(AttentionShared& s, T* out, const T* q, const C* k_cache, const C* v_cache,
                                const uint32_t* meta, const float* sinks, const float* rotation, int rows, int seqs,
                                int num_heads, int num_kv_heads, int head_dim, int block_size,
                                int q_stride, float scale, float v_scale, int window, int vector_keys) {
    const int row = blockIdx.x, head = blockIdx.y, tid = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32;
    const int pos = (int)meta[rows + row];
    const uint32_t* table = meta + 2 * rows + seqs + meta[2 * rows + meta[row]];
    const int kv_head = head / (num_heads / num_kv_heads);
    const size_t kv_width = (size_t)num_kv_heads * head_dim;
    const size_t q_offset = (size_t)row * q_stride + (size_t)head * head_dim;
    const size_t out_offset = (size_t)row * num_heads * head_dim + (size_t)head * head_dim;

    const int half = head_dim / 2;
    for (int d = tid; d < head_dim; d += ATTN_THREADS) {
        if (!rotation) {
            s.q[d] = to_f32(q[q_offset + d]);
            continue;
        }
        const int j = d % half;
        const float c = rotation[(size_t)row * half + j], sn = rotation[((size_t)rows + row) * half + j];
        const float a = to_f32(q[q_offset + j]), b = to_f32(q[q_offset + j + half]);
        const float r = d < half ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)) : __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, c));
        s.q[d] = to_f32(from_f32<T>(r));
    }
    __syncthreads();

    float m = -INFINITY, denom = 0.f;
    float acc[DIMS];
#pragma unroll
    for (int i = 0; i < DIMS; ++i) acc[i] = 0.f;
    const int first = window > 0 ? max(0, pos + 1 - window) : 0;
    warp_tiles<C, DIMS>(s, k_cache, v_cache, table, first, pos, kv_width, (size_t)kv_head * head_dim, head_dim,
                        block_size, scale, vector_keys, m, denom, acc);
    denom = warp_sum(denom);
    if (lane == 0) {
        s.max[warp] = m;
        s.denom[warp] = denom;
    }
#pragma unroll
    for (int i = 0; i < DIMS; ++i)
        if (lane + 32 * i < head_dim) s.acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();

    // Warp 0 always has the window's first tile, so the largest logit is finite, and a warp
    // with no tile (max -inf, nothing summed) adds zeros.
    float top = sinks ? sinks[head] : -INFINITY;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) top = fmaxf(top, s.max[w]);
    float factor[ATTN_WARPS];
    float total = sinks ? expf(sinks[head] - top) : 0.f;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) {
        factor[w] = expf(s.max[w] - top);
        total = fmaf(s.denom[w], factor[w], total);
    }
    for (int d = tid; d < head_dim; d += ATTN_THREADS) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) sum = fmaf(s.acc[w][d], factor[w], sum);
        out[out_offset + d] = from_f32<T>(sum * v_scale / total);
    }
}

// DIMS, the dimensions a lane sums, from the head's size, so that few of a lane's sums idle
// (a head of 32 or fewer leaves half of them: rare, and one variant fewer). Two blocks an SM at
// least: without that bound ptxas holds the kernel to 64 registers and spills.
#define PAGED_ATTENTION(NAME, T, C)                                                                                    \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, 2) NAME(                                                \
        T* out, const T* q, const C* k_cache, const C* v_cache, const uint32_t* meta,                                  \
        const float* sinks, const float* rotation, int rows, int seqs, int num_heads,                                  \
        int num_kv_heads, int head_dim, int block_size, int q_stride, float scale,                                     \
        float v_scale, int window, int vector_keys) {                                                                  \
        __shared__ AttentionShared s;                                                                                  \
        if (head_dim <= 64)                                                                                            \
            paged_attention<T, C, 2>(s, out, q, k_cache, v_cache, meta, sinks, rotation, rows, seqs, num_heads,        \
                                     num_kv_heads, head_dim, block_size, q_stride, scale, v_scale, window, vector_keys); \
        else if (head_dim <= 128)                                                                                      \
            paged_attention<T, C, 4>(s, out, q, k_cache, v_cache, meta, sinks, rotation, rows, seqs, num_heads,        \
                                     num_kv_heads, head_dim, block_size, q_stride, scale, v_scale, window, vector_keys); \
        else                                                                                                           \
            paged_attention<T, C, 8>(s, out, q, k_cache, v_cache, meta, sinks, rotation, rows, seqs, num_heads,        \
                                     num_kv_heads, head_dim, block_size, q_stride, scale, v_scale, window, vector_keys); \
    }

PAGED_ATTENTION(paged_attention_f32_f32, float, float)
PAGED_ATTENTION(paged_attention_f32_bf16, float, __nv_bfloat16)
PAGED_ATTENTION(paged_attention_bf16_f32, __nv_bfloat16, float)
PAGED_ATTENTION(paged_attention_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
PAGED_ATTENTION(paged_attention_f32_f8e4m3, float, __nv_fp8_e4m3)
PAGED_ATTENTION(paged_attention_bf16_f8e4m3, __nv_bfloat16, __nv_fp8_e4m3)

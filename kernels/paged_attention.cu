// Causal attention of a flattened batch's query rows over the paged KV cache: decode rows,
// verification windows and prefill chunks alike, with GQA, an optional sliding window and an
// optional sink logit per query head. `scale` is the score's, the key cache's per-tensor scale
// included; `v_scale` the value cache's (both 1 but for FP8 caches).
//
// Blocks of ATTN_WARPS warps, gridDim.z of them per group of members, query rows and heads
// (below). A row's keys, from the first in its window to its own position, are cut into parts
// (below), and a part into tiles of 32 positions; warp w takes tiles w,
// w + ATTN_WARPS, ... and keeps its own online softmax over them: a lane scores one key of the
// tile, and then sums the tile's values for its own dimensions (lane, lane + 32, ...), key by
// key in position order. At the end the warps' partial softmaxes are merged in warp order, the
// sink as one more logit of the denominator. A tile's work is thus one round of key loads and
// one of value loads, all in flight at once, with no barrier of the block between tiles, so a
// long context is walked by all the warps together rather than tile after tile.
//
// A block serves up to ATTN_GROUP members, (query row, query head) pairs that read the same keys
// and values, and each of a warp's key and value loads serves every member, which keeps a
// softmax of its own and sums only its own keys. In `paged_attention_*` the members are up to
// ATTN_GROUP rows of a sequence at one head, under full attention (the rows of a prefill chunk
// or a verification window, grouped by aligned positions: joins_previous; the blocks of the
// group's other rows return at once). In `paged_attention_heads_*`, for launches where no rows
// would share a block (decode rows, or any under a window) and, unless told to group them, where
// a block a head would overfill the GPU (the launcher's choice), they are `head_group` query
// heads of one KV head at one row, so that GQA's heads read their KV head's keys once rather
// than once each; blockIdx.y then counts groups of heads.
//
// A row of up to ATTN_SPLIT_MIN keys is one part, and its warps' softmaxes are merged straight
// into its output. A longer row's keys are cut into parts of ATTN_SPLIT_MIN positions or more
// (at most ATTN_MAX_SPLITS parts), each walked as above into a partial softmax, and the
// parts' partials are folded in part order, the sink first (`Fold`). Where a launch has few
// rows, the launcher gives each row gridDim.z > 1 blocks, which share its parts (part z,
// z + gridDim.z, ...) so that a long context is read by many SMs at once: each writes its
// partials to `partials`, and the last to finish, counted in `counters` (zero before the
// launch, and left zero by it), folds them all. With one block a row, it walks the parts in
// order and folds each as it goes.
//
// Batch invariance: a row's parts, its tiles, the warp that takes each, the operations of its
// softmax and sums and the merges and folds depend only on the row's own window and position,
// never on the rows or heads it is grouped with or on how many blocks share its parts, so each
// output element is the same chain of operations whatever else the launch holds, and whichever
// of the two kernels computes it.
//
// A lane reads its key 8 elements a load where the launcher says the cache's rows allow it
// (`vector_keys`: head_dim % 8 == 0, the cache 16-byte aligned): each of the warp's loads then
// brings a whole sector of each of its 32 keys. Loads never wait behind a branch (a lane
// past the head rereads its last elements and sums nothing), and the loops are unrolled so that
// 16 to 32 loads of a lane are in flight at once. Neither moves the order of the sums.
//
// `q`'s rows are `q_stride` elements apart (a column range of a wider tensor), `out`'s
// num_heads * head_dim. Where `rotation` is not null, each query is rotated as it is read by its
// row of the tables [2, table_len, head_dim / 2] (cos, then sin): row `table_rows[row]`, or
// the row's own where that is null (common.cuh's rotary_pair); each element by rope.cu's
// arithmetic, rounded to T, as a launch of rope.cu would have written it.
//
// `meta` packs the batch's layout as u32: the sequence of each row [rows], the position of
// each row [rows], the offset of each sequence's block table [seqs], then the block tables.
#include "common.cuh"

#define ATTN_WARPS 8
#define ATTN_THREADS (ATTN_WARPS * 32)
#define ATTN_TILE 32
#define ATTN_MAX_HEAD_DIM 256
#define ATTN_GROUP 4
#define ATTN_SPLIT_MIN 1024
#define ATTN_MAX_SPLITS 16
#define ATTN_BLOCKS_PER_SM 2

// What a block shares: its rows' queries, each warp's tile weights (a row each) and slots, and
// each warp's partial softmax of one row at a time for the merge.
struct AttentionShared {
    float q[ATTN_GROUP][ATTN_MAX_HEAD_DIM];
    float weights[ATTN_WARPS][ATTN_GROUP][ATTN_TILE];
    uint32_t slots[ATTN_WARPS][ATTN_TILE];
    float acc[ATTN_WARPS][ATTN_MAX_HEAD_DIM];
    float max[ATTN_WARPS];
    float denom[ATTN_WARPS];
    // Each row's fold of the parts walked so far, where one block walks them all: its largest
    // logit and denominator, and a thread's dimension of its sums.
    float fold_max[ATTN_GROUP];
    float fold_denom[ATTN_GROUP];
    float fold_acc[ATTN_GROUP][ATTN_MAX_HEAD_DIM];
    // Whether this block finished its row's parts last, and so folds them.
    int folds;
};

// How a row's keys, from `first` to its position, are cut into parts: `n` parts of `tiles`
// tiles each, the last part shorter. The rows of a group split alike, as ATTN_GROUP divides
// ATTN_TILE and ATTN_SPLIT_MIN. Every row has keys in every part: n - 1 parts of
// ceil(tiles / n) tiles fall short of all the tiles where n <= ATTN_MAX_SPLITS (then
// (n - 1)^2 < tiles), so the last part starts at or before the last tile, which every row of a
// group has.
struct Parts {
    int n, tiles;
};

__device__ __forceinline__ Parts parts_of(int first, int pos) {
    const int span = pos + 1 - first;
    const int n = min(ATTN_MAX_SPLITS, (span + ATTN_SPLIT_MIN - 1) / ATTN_SPLIT_MIN);
    const int tiles = (span + ATTN_TILE - 1) / ATTN_TILE;
    return {n, (tiles + n - 1) / n};
}

// A row's softmax folded over its parts in order: its largest logit, its denominator and, for
// the thread's dimension, its weighted sum. It starts at the sink (or nothing), and each part's
// partial is rescaled into it as an online softmax does a key's.
struct Fold {
    float max, denom, acc;
};

__device__ __forceinline__ Fold fold_start(const float* sinks, int head) {
    return sinks ? Fold{sinks[head], 1.f, 0.f} : Fold{-INFINITY, 0.f, 0.f};
}

__device__ __forceinline__ Fold fold(Fold f, float part_max, float part_denom, float part_acc) {
    const float top = fmaxf(f.max, part_max);
    const float old_factor = expf(f.max - top), part_factor = expf(part_max - top);
    return {top, fmaf(part_denom, part_factor, __fmul_rn(f.denom, old_factor)),
            fmaf(part_acc, part_factor, __fmul_rn(f.acc, old_factor))};
}

// Whether `row` is in the group of the row before it: the next position of the same sequence,
// not at a multiple of ATTN_GROUP, under full attention.
__device__ __forceinline__ bool joins_previous(const uint32_t* meta, int rows, int row, int window) {
    if (window > 0 || row == 0) return false;
    const uint32_t pos = meta[rows + row];
    return meta[row] == meta[row - 1] && pos == meta[rows + row - 1] + 1 && pos % ATTN_GROUP != 0;
}

// The cache slot of a tile's key for this lane: position t0 + lane, or, for a lane past the
// group's last position `last`, the tile's first (read, never summed). t0 <= last.
__device__ __forceinline__ uint32_t tile_slot(const uint32_t* table, int t0, int last, int block_size) {
    const int lane = threadIdx.x % 32;
    const int p = t0 + lane <= last ? t0 + lane : t0;
    return table[p / block_size] * block_size + p % block_size;
}

// One warp's online softmaxes, a member each, over its tiles of the part from `first` to
// before `end`. The `count` members are at positions pos0 + r * ROW_STEP (consecutive rows, or
// one row's heads with ROW_STEP 0), and share the tiles' keys and values. DIMS is the
// dimensions a lane sums (head_dim <= 32 * DIMS); `acc[r][i]` is member r's dimension
// lane + 32 i. `m[r]` is its largest score seen, `denom[r]` the lane's share of its
// denominator (its keys' weights).
template <typename C, int DIMS, int ROW_STEP>
__device__ void warp_tiles(AttentionShared& s, const C* k_cache, const C* v_cache, const uint32_t* table, int first,
                           int end, int pos0, int count, size_t kv_width, size_t kv_offset, int head_dim, int block_size,
                           float scale, int vector_keys, float (&m)[ATTN_GROUP], float (&denom)[ATTN_GROUP],
                           float (&acc)[ATTN_GROUP][DIMS]) {
    // Loads of a lane in flight at once, within the registers: a key's whole row up to
    // head_dim 128 (half of it at 256), and the values of 32 / DIMS keys (2 at 256).
    constexpr int key_loads_at_once = DIMS < 8 ? 8 : 4;
    constexpr int keys_at_once = DIMS < 8 ? ATTN_TILE / DIMS : 2;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int last = min(pos0 + (count - 1) * ROW_STEP + 1, end) - 1;
    int t0 = first + warp * ATTN_TILE;
    uint32_t slot = t0 <= last ? tile_slot(table, t0, last, block_size) : 0;
    for (; t0 <= last; t0 += ATTN_WARPS * ATTN_TILE) {
        // The warp's next tile's slots, read first, so that the table's load overlaps this
        // tile rather than delaying the next tile's keys.
        const int next = t0 + ATTN_WARPS * ATTN_TILE;
        const uint32_t next_slot = next <= last ? tile_slot(table, next, last, block_size) : 0;
        float dot[ATTN_GROUP];
#pragma unroll
        for (int r = 0; r < ATTN_GROUP; ++r) dot[r] = 0.f;
        if (t0 + lane <= last) {
            const C* key = k_cache + slot * kv_width + kv_offset;
            if (vector_keys) {
                // Bounded by DIMS rather than head_dim, so that unrolling leaves no remainder
                // loop; past the head a lane rereads its last 8 elements and sums nothing, so
                // that no load waits behind a branch and all of them are in flight at once.
#pragma unroll key_loads_at_once
                for (int d0 = 0; d0 < 32 * DIMS; d0 += 8) {
                    float k8[8];
                    load8(key + min(d0, head_dim - 8), k8);
#pragma unroll
                    for (int r = 0; r < ATTN_GROUP; ++r)
#pragma unroll
                        for (int j = 0; j < 8; ++j)
                            if (d0 < head_dim && r < count) dot[r] = fmaf(s.q[r][d0 + j], k8[j], dot[r]);
                }
            } else {
                // Heads of no multiple of 8 elements, or an unaligned cache: rare, kept short.
#pragma unroll 1
                for (int d = 0; d < head_dim; ++d) {
                    const float k = to_f32(key[d]);
#pragma unroll
                    for (int r = 0; r < ATTN_GROUP; ++r)
                        if (r < count) dot[r] = fmaf(s.q[r][d], k, dot[r]);
                }
            }
        }
        // Member r's keys in this tile: none past its own position (or past the group).
        int n[ATTN_GROUP];
#pragma unroll
        for (int r = 0; r < ATTN_GROUP; ++r) {
            n[r] = r < count ? max(0, min(ATTN_TILE, pos0 + r * ROW_STEP + 1 - t0)) : 0;
            if (n[r] == 0) continue;
            const float score = lane < n[r] ? dot[r] * scale : -INFINITY;
            const float m_new = fmaxf(m[r], warp_reduce(score, Max()));
            const float rescale = expf(m[r] - m_new);
            const float w = lane < n[r] ? expf(score - m_new) : 0.f;
            denom[r] = fmaf(denom[r], rescale, w);
            s.weights[warp][r][lane] = w;
#pragma unroll
            for (int i = 0; i < DIMS; ++i) acc[r][i] *= rescale;
            m[r] = m_new;
        }
        s.slots[warp][lane] = slot;
        __syncwarp();
        // Over the whole tile, so that unrolling leaves no remainder loop; each row sums its
        // own keys only. A lane's dimensions past the head reread the head's last (summed into
        // sums never written), so that no load waits behind a branch.
#pragma unroll keys_at_once
        for (int j = 0; j < ATTN_TILE; ++j) {
            const C* value = v_cache + s.slots[warp][j] * kv_width + kv_offset;
            float v[DIMS];
#pragma unroll
            for (int i = 0; i < DIMS; ++i) v[i] = to_f32(value[min(lane + 32 * i, head_dim - 1)]);
#pragma unroll
            for (int r = 0; r < ATTN_GROUP; ++r)
#pragma unroll
                for (int i = 0; i < DIMS; ++i)
                    if (j < n[r]) acc[r][i] = fmaf(s.weights[warp][r][j], v[i], acc[r][i]);
        }
        slot = next_slot;
        // The next tile overwrites the weights and slots this one's lanes read.
        __syncwarp();
    }
}

// Member r's warp partials (`warp_tiles`'s) into shared memory, for `merge_warps`.
template <int DIMS>
__device__ __forceinline__ void gather_warps(AttentionShared& s, float m, float denom, const float (&acc)[DIMS],
                                             int head_dim) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float row_denom = warp_sum(denom);
    if (lane == 0) {
        s.max[warp] = m;
        s.denom[warp] = row_denom;
    }
#pragma unroll
    for (int i = 0; i < DIMS; ++i)
        if (lane + 32 * i < head_dim) s.acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
}

// The gathered warp partials merged in warp order, `extra` as one more logit of the
// denominator (the sink, or -inf for none): the largest logit, the denominator and the sum of
// the thread's dimension (none past the head). Warp 0 always has the part's first tile, so the
// largest logit is finite, and a warp with no tile (max -inf, nothing summed) adds zeros.
__device__ __forceinline__ Fold merge_warps(const AttentionShared& s, float extra, int head_dim) {
    float top = extra;
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) top = fmaxf(top, s.max[w]);
    float factor[ATTN_WARPS];
    float total = expf(extra - top);
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) {
        factor[w] = expf(s.max[w] - top);
        total = fmaf(s.denom[w], factor[w], total);
    }
    float sum = 0.f;
    if ((int)threadIdx.x < head_dim)
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) sum = fmaf(s.acc[w][threadIdx.x], factor[w], sum);
    return {top, total, sum};
}

// Where a part's partial softmax of a row of a head is kept for the block that folds them:
// its largest logit, its denominator, then its head_dim sums.
__device__ __forceinline__ float* partial_at(float* partials, int row, int head, int part, int num_heads,
                                             int head_dim) {
    return partials + (((size_t)row * num_heads + head) * ATTN_MAX_SPLITS + part) * (head_dim + 2);
}

// The members of a block (see the top): ROW_STEP 1 for rows of a sequence at one head, 0 for
// heads of one row. Member r's row is row + r * ROW_STEP, its head head + r * (1 - ROW_STEP),
// its position pos0 + r * ROW_STEP.
template <typename T, typename C, int DIMS, int ROW_STEP>
__device__ void paged_attention(AttentionShared& s, T* out, const T* q, const C* k_cache, const C* v_cache,
                                const uint32_t* meta, const float* sinks, const float* rotation,
                                const uint32_t* table_rows, int table_len, float* partials, uint32_t* counters,
                                int rows, int seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                                int q_stride, float scale, float v_scale, int window, int vector_keys,
                                int head_group) {
    constexpr int HEAD_STEP = 1 - ROW_STEP;
    const int row = blockIdx.x, head = blockIdx.y * (ROW_STEP ? 1 : head_group), part = blockIdx.z,
              blocks = gridDim.z, tid = threadIdx.x;
    // A group's first row's block computes it all; the others' have nothing to do.
    if (ROW_STEP && joins_previous(meta, rows, row, window)) return;
    const int pos0 = (int)meta[rows + row];
    // A group of rows has full attention; a row alone, or a group of heads, may have a window.
    const int first = window > 0 ? max(0, pos0 + 1 - window) : 0;
    const Parts parts = parts_of(first, pos0);
    if (part >= parts.n) return;
    int count = ROW_STEP ? 1 : head_group;
    if (ROW_STEP)
        while (count < ATTN_GROUP && row + count < rows && joins_previous(meta, rows, row + count, window)) ++count;

    const uint32_t* table = meta + 2 * rows + seqs + meta[2 * rows + meta[row]];
    const int kv_head = head / (num_heads / num_kv_heads);
    const size_t kv_width = (size_t)num_kv_heads * head_dim;
    // One part: merged straight into the output. Several, in one block: folded as they come.
    const bool whole = parts.n == 1, folds_here = !whole && blocks == 1;

    const int half = head_dim / 2;
    for (int e = tid; e < count * head_dim; e += ATTN_THREADS) {
        const int r = e / head_dim, d = e % head_dim;
        const size_t q_offset = (size_t)(row + r * ROW_STEP) * q_stride + (size_t)(head + r * HEAD_STEP) * head_dim;
        if (!rotation) {
            s.q[r][d] = to_f32(q[q_offset + d]);
            continue;
        }
        const int j = d % half;
        const float2 cos_sin = rotary_pair(rotation, table_rows, table_len, row + r * ROW_STEP, j, half);
        const float x = rotate_element(to_f32(q[q_offset + j]), to_f32(q[q_offset + j + half]), cos_sin, d < half);
        s.q[r][d] = to_f32(from_f32<T>(x));
    }
    if (folds_here) {
        for (int e = tid; e < count * head_dim; e += ATTN_THREADS)
            s.fold_acc[e / head_dim][e % head_dim] = fold_start(sinks, head + e / head_dim * HEAD_STEP).acc;
        if (tid < count) {
            const Fold start = fold_start(sinks, head + tid * HEAD_STEP);
            s.fold_max[tid] = start.max;
            s.fold_denom[tid] = start.denom;
        }
    }
    __syncthreads();

    for (int p = part; p < parts.n; p += blocks) {
        const int begin = first + p * parts.tiles * ATTN_TILE;
        float m[ATTN_GROUP], denom[ATTN_GROUP], acc[ATTN_GROUP][DIMS];
#pragma unroll
        for (int r = 0; r < ATTN_GROUP; ++r) {
            m[r] = -INFINITY;
            denom[r] = 0.f;
#pragma unroll
            for (int i = 0; i < DIMS; ++i) acc[r][i] = 0.f;
        }
        warp_tiles<C, DIMS, ROW_STEP>(s, k_cache, v_cache, table, begin, begin + parts.tiles * ATTN_TILE, pos0, count,
                                      kv_width, (size_t)kv_head * head_dim, head_dim, block_size, scale, vector_keys, m,
                                      denom, acc);
#pragma unroll
        for (int r = 0; r < ATTN_GROUP; ++r) {
            if (r >= count) break;
            const int member_row = row + r * ROW_STEP, member_head = head + r * HEAD_STEP;
            gather_warps<DIMS>(s, m[r], denom[r], acc[r], head_dim);
            const Fold merged = merge_warps(s, whole && sinks ? sinks[member_head] : -INFINITY, head_dim);
            Fold folded = merged;
            if (whole) {
                if (tid < head_dim)
                    out[(size_t)member_row * num_heads * head_dim + (size_t)member_head * head_dim + tid] =
                        from_f32<T>(merged.acc * v_scale / merged.denom);
            } else if (folds_here) {
                const Fold before = {s.fold_max[r], s.fold_denom[r], tid < head_dim ? s.fold_acc[r][tid] : 0.f};
                folded = fold(before, merged.max, merged.denom, merged.acc);
                if (tid < head_dim) s.fold_acc[r][tid] = folded.acc;
            } else {
                float* at = partial_at(partials, member_row, member_head, p, num_heads, head_dim);
                if (tid == 0) {
                    at[0] = merged.max;
                    at[1] = merged.denom;
                }
                if (tid < head_dim) at[2 + tid] = merged.acc;
            }
            // The next row's partials overwrite these, and every thread has read the fold's.
            __syncthreads();
            if (folds_here && tid == 0) {
                s.fold_max[r] = folded.max;
                s.fold_denom[r] = folded.denom;
            }
        }
    }
    if (whole) return;
    if (folds_here) {
        __syncthreads();
        for (int e = tid; e < count * head_dim; e += ATTN_THREADS) {
            const int r = e / head_dim, d = e % head_dim;
            out[(size_t)(row + r * ROW_STEP) * num_heads * head_dim + (size_t)(head + r * HEAD_STEP) * head_dim + d] =
                from_f32<T>(s.fold_acc[r][d] * v_scale / s.fold_denom[r]);
        }
        return;
    }

    // Blocks share the members' parts: the last to finish folds what all of them wrote, counted
    // under the first member's (row, head). The fences order each block's partials before its
    // count, and the count before the reads.
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        uint32_t* counter = counters + (size_t)row * num_heads + head;
        const uint32_t mine = (parts.n - part + blocks - 1) / blocks;
        s.folds = atomicAdd(counter, mine) + mine == (uint32_t)parts.n;
        // Every block of the row has counted: zero again for the next launch.
        if (s.folds) *counter = 0;
    }
    __syncthreads();
    if (!s.folds) return;
    __threadfence();
    for (int r = 0; r < count; ++r) {
        const int member_row = row + r * ROW_STEP, member_head = head + r * HEAD_STEP;
        Fold f = fold_start(sinks, member_head);
        for (int p = 0; p < parts.n; ++p) {
            const float* at = partial_at(partials, member_row, member_head, p, num_heads, head_dim);
            f = fold(f, __ldcg(at), __ldcg(at + 1), tid < head_dim ? __ldcg(at + 2 + tid) : 0.f);
        }
        if (tid < head_dim)
            out[(size_t)member_row * num_heads * head_dim + (size_t)member_head * head_dim + tid] =
                from_f32<T>(f.acc * v_scale / f.denom);
    }
}

// DIMS, the dimensions a lane sums, from the head's size, so that few of a lane's sums idle
// (a head of 32 or fewer leaves half of them: rare, and one variant fewer). ATTN_BLOCKS_PER_SM
// blocks an SM at least: without that bound ptxas holds the kernel to 64 registers and spills.
// The kernel of groups of heads serves heads of up to ATTN_HEAD_GROUPS_MAX_DIM: the registers of
// a larger head's sums leave no room for another kernel body.
#define ATTN_HEAD_GROUPS_MAX_DIM 128

#define PAGED_ATTENTION_ARGS(T, C)                                                                             \
    T *out, const T *q, const C *k_cache, const C *v_cache, const uint32_t *meta, const float *sinks,          \
        const float *rotation, const uint32_t *table_rows, int table_len, float *partials, uint32_t *counters, \
        int rows, int seqs, int num_heads, int num_kv_heads, int head_dim, int block_size, int q_stride,       \
        float scale, float v_scale, int window, int vector_keys, int head_group
#define PAGED_ATTENTION_CALL(T, C, DIMS, ROW_STEP)                                                             \
    paged_attention<T, C, DIMS, ROW_STEP>(s, out, q, k_cache, v_cache, meta, sinks, rotation, table_rows,      \
                                          table_len, partials, counters, rows, seqs, num_heads, num_kv_heads,  \
                                          head_dim, block_size, q_stride, scale, v_scale, window, vector_keys, \
                                          head_group)

// paged_attention_T_C (rows of a sequence share a block) and paged_attention_heads_T_C (heads of
// a row do, `head_group` of them).
#define PAGED_ATTENTION(TYPES, T, C)                                                                           \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, ATTN_BLOCKS_PER_SM)                             \
        paged_attention_##TYPES(PAGED_ATTENTION_ARGS(T, C)) {                                                  \
        __shared__ AttentionShared s;                                                                          \
        if (head_dim <= 64)                                                                                    \
            PAGED_ATTENTION_CALL(T, C, 2, 1);                                                                  \
        else if (head_dim <= 128)                                                                              \
            PAGED_ATTENTION_CALL(T, C, 4, 1);                                                                  \
        else                                                                                                   \
            PAGED_ATTENTION_CALL(T, C, 8, 1);                                                                  \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS, ATTN_BLOCKS_PER_SM)                             \
        paged_attention_heads_##TYPES(PAGED_ATTENTION_ARGS(T, C)) {                                            \
        __shared__ AttentionShared s;                                                                          \
        if (head_dim <= 64)                                                                                    \
            PAGED_ATTENTION_CALL(T, C, 2, 0);                                                                  \
        else if (head_dim <= ATTN_HEAD_GROUPS_MAX_DIM)                                                         \
            PAGED_ATTENTION_CALL(T, C, 4, 0);                                                                  \
        else                                                                                                   \
            __trap();                                                                                          \
    }

PAGED_ATTENTION(f32_f32, float, float)
PAGED_ATTENTION(f32_bf16, float, __nv_bfloat16)
PAGED_ATTENTION(bf16_f32, __nv_bfloat16, float)
PAGED_ATTENTION(bf16_bf16, __nv_bfloat16, __nv_bfloat16)
PAGED_ATTENTION(f32_f8e4m3, float, __nv_fp8_e4m3)
PAGED_ATTENTION(bf16_f8e4m3, __nv_bfloat16, __nv_fp8_e4m3)

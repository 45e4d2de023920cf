// A mixture-of-experts block with MXFP4 expert weights (gpt-oss), on the device from the
// router's logits to the block's output, in four launches:
//   moe_route_group  each row's top-k experts and routing weights, then the (row, rank) pairs
//                    grouped by expert, and tiles of up to `tile` pairs of one expert (the
//                    launcher's choice: MOE_TILE, or MOE_WIDE_TILE for the wide mma kernels);
//   moe_gate_up      per tile, the gate and up projections with their biases and the (clamped)
//                    SwiGLU: activations [pairs, I] in f32;
//   moe_down         per tile, the down projection with its bias: [pairs, H] in f32;
//   moe_combine      each row's experts' outputs weighted, in rank order; in a model, the next
//                    block's input norm does this as it adds them to the residual stream instead
//                    (rms_norm.cu's experts_add_rms_norm_*), the final norm too; it serves
//                    `Mxfp4Experts::forward`, which sums them.
//
// Expert weights, per expert: `blocks` [out, in / 32, 16] bytes, two e2m1 values a byte (low
// nibble first), and `scales` [out, in / 32], each scaling 32 values by 2^(e - 127); gate_up's
// rows are the I gate rows, then the I up rows. Weights are dequantized in registers as read.
//
// Batch invariance: one warp computes one output column for the pairs of its tile; lane l sums
// MXFP4 blocks l, l + 32, ... of the inner dimension in order, 32 products each (their inputs
// read 8 at a time by vector loads: rows start 16-byte aligned), then the warp reduces by a
// fixed butterfly. The order depends on the inner dimension alone, so a pair's
// result is the same whatever other pairs, rows or experts share the launch.
#include "common.cuh"
#include "mma.cuh"

#define MOE_TILE 8
#define MOE_WIDE_TILE 32
#define MOE_WARPS 4
#define MOE_MAX_EXPERTS 1024

// ---- routing ---------------------------------------------------------------------------------

// Row `row`'s routing, by one warp: k rounds of a warp argmax over the experts not yet chosen,
// in the CPU sort's order (total_cmp, ties to the lower index: with NaN or signed zeros too,
// every lane agrees on the pick), then the weights: each chosen expert's exp(s - max) over the
// sum of the k chosen (normalize) or of all experts. Lane l owns experts l, l + 32, ...;
// k <= experts.
template <typename T>
__device__ void route_row(const T* logits, int row, int experts, int k, int normalize, int* ids, float* weights) {
    const int lane = threadIdx.x % 32;
    const T* s = logits + (size_t)row * experts;
    uint32_t taken = 0;  // bit j: expert lane + 32 j chosen
    float best_score = 0.f, sum = 0.f;
    for (int rank = 0; rank < k; ++rank) {
        uint32_t key = 0;
        int index = experts;  // no pick
        for (int j = 0, e = lane; e < experts; ++j, e += 32) {
            const uint32_t x = order_key(to_f32(s[e]));
            if (!(taken >> j & 1) && (index == experts || x > key)) {
                key = x;
                index = e;
            }
        }
        for (int offset = 16; offset > 0; offset /= 2) {
            const uint32_t other = __shfl_xor_sync(0xffffffff, key, offset);
            const int other_index = __shfl_xor_sync(0xffffffff, index, offset);
            const bool better = other > key || (other == key && other_index < index);
            if (other_index != experts && (index == experts || better)) {
                key = other;
                index = other_index;
            }
        }
        const float score = to_f32(s[index]);
        if (index % 32 == lane) taken |= 1u << (index / 32);
        if (rank == 0) best_score = score;
        const float x = expf(score - best_score);
        if (lane == 0) {
            ids[row * k + rank] = index;
            weights[row * k + rank] = x;
        }
        sum += x;
    }
    if (!normalize) {
        float all = 0.f;
        for (int e = lane; e < experts; e += 32) all += expf(to_f32(s[e]) - best_score);
        sum = warp_sum(all);
    }
    __syncwarp();
    if (lane == 0)
        for (int rank = 0; rank < k; ++rank) weights[row * k + rank] /= sum;
}

// The pairs grouped by expert, by one block of at least `experts` threads (at most
// MOE_MAX_EXPERTS): thread e counts the pairs routed to expert e and, after a prefix sum, writes
// them in (row, rank) order: `pair_rows[p]` is the row of sorted pair p and
// `pair_of[row * k + rank]` its index. Tiles list each expert's pairs `tile` at a time:
// `tiles[3 t ..]` = (expert, first pair, pairs); `num_tiles[0]` says how many there are.
__device__ void group_pairs(const int* ids, int pairs, int experts, int* pair_rows, int* pair_of, int* tiles,
                            int* num_tiles, int k, int tile) {
    __shared__ int offsets[MOE_MAX_EXPERTS + 1];
    const int e = threadIdx.x;
    int count = 0;
    if (e < experts)
        for (int i = 0; i < pairs; ++i) count += ids[i] == e;
    if (e < experts) offsets[e + 1] = count;
    __syncthreads();
    if (e == 0) {
        offsets[0] = 0;
        int t = 0;
        for (int x = 0; x < experts; ++x) {
            const int n = offsets[x + 1];
            offsets[x + 1] = offsets[x] + n;
            for (int first = 0; first < n; first += tile) {
                tiles[3 * t] = x;
                tiles[3 * t + 1] = offsets[x] + first;
                tiles[3 * t + 2] = min(tile, n - first);
                ++t;
            }
        }
        num_tiles[0] = t;
    }
    __syncthreads();
    if (e >= experts) return;
    int next = offsets[e];
    for (int i = 0; i < pairs; ++i) {
        if (ids[i] != e) continue;
        pair_rows[next] = i / k;
        pair_of[i] = next;
        ++next;
    }
}

// Routing and grouping in one launch of one block of MOE_ROUTE_THREADS: its warps route rows
// warp, warp + 32, ... (`route_row`), then, once every row's experts are written (a barrier
// makes a block's global writes visible to the whole block), it groups the pairs
// (`group_pairs`), a thread an expert. A decode step's few rows would leave a launch of their
// own mostly waiting.
#define MOE_ROUTE_THREADS MOE_MAX_EXPERTS

template <typename T>
__device__ void moe_route_group(const T* logits, int rows, int experts, int k, int normalize, int* ids,
                                float* weights, int* pair_rows, int* pair_of, int* tiles, int* num_tiles, int tile) {
    for (int row = threadIdx.x / 32; row < rows; row += blockDim.x / 32)
        route_row(logits, row, experts, k, normalize, ids, weights);
    __syncthreads();
    group_pairs(ids, rows * k, experts, pair_rows, pair_of, tiles, num_tiles, k, tile);
}

#define MOE_ROUTE_GROUP(NAME, T)                                                               \
    extern "C" __global__ void __launch_bounds__(MOE_ROUTE_THREADS)                            \
        NAME(const T* logits, int rows, int experts, int k, int normalize, int* ids, float* weights, \
             int* pair_rows, int* pair_of, int* tiles, int* num_tiles, int tile) {              \
        moe_route_group<T>(logits, rows, experts, k, normalize, ids, weights, pair_rows, pair_of, tiles, \
                           num_tiles, tile);                                                    \
    }

MOE_ROUTE_GROUP(moe_route_group_f32, float)
MOE_ROUTE_GROUP(moe_route_group_bf16, __nv_bfloat16)

// ---- expert projections ------------------------------------------------------------------------

// The tile this block serves, or false when the grid's bound exceeds the tiles there are.
struct Tile {
    int expert, first, count;
};

__device__ __forceinline__ bool tile_of(const int* tiles, const int* num_tiles, Tile* t) {
    if ((int)blockIdx.y >= num_tiles[0]) return false;
    t->expert = tiles[3 * blockIdx.y];
    t->first = tiles[3 * blockIdx.y + 1];
    t->count = tiles[3 * blockIdx.y + 2];
    return true;
}

// A pair of bf16 values from its bits (the first in the low half), and back.
__device__ __forceinline__ __nv_bfloat162 bf16_pair(uint32_t bits) { return *reinterpret_cast<__nv_bfloat162*>(&bits); }
__device__ __forceinline__ uint32_t bf16_pair_bits(__nv_bfloat162 pair) { return *reinterpret_cast<uint32_t*>(&pair); }

// Codes 0..7's magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} as bf16, byte by byte, for
// __byte_perm's lookup of four codes at a time: their low bytes (byte i of the pair of words
// is code i's), then their high bytes.
#define E2M1_LOW_BYTES_0 0xC0800000u
#define E2M1_LOW_BYTES_1 0xC0804000u
#define E2M1_HIGH_BYTES_0 0x3F3F3F00u
#define E2M1_HIGH_BYTES_1 0x40404040u

// The eight weights whose codes `word` holds (low nibble first) of an MXFP4 block with scale
// `scale`, as bf16 pairs in order (pair i: weights 2i and 2i + 1, the first in the low half):
// each e2m1 value times 2^(scale - 127), where scale 0 is the subnormal 2^-127 and 255
// infinity, as the CPU's table has them. A code's magnitude is looked up by byte permutes, its
// sign moved in, and each pair multiplied by the scale in bf16, which is exact: an e2m1 value
// times a power of two has two significant bits, and bf16 has f32's range, subnormals
// included (a product past it overflows to infinity, as the CPU's f32 does). Every instruction
// here counts: where a projection has few rows, dequantization, not memory, bounds it.
__device__ __forceinline__ uint4 dequantize8_bf16(uint32_t word, uint8_t scale) {
    const uint32_t magnitudes = word & 0x77777777u;
    // The sign of code 2i + 1 is the top bit of byte i of `word`; that of code 2i, of `word << 4`.
    const uint32_t even_signs = word << 4;
    const uint32_t scale_bits = max((uint32_t)scale << 7, 0x40u);
    const __nv_bfloat162 scale2 = bf16_pair(scale_bits | scale_bits << 16);
    uint32_t p[4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const uint32_t codes = magnitudes >> (16 * half);
        const uint32_t low = __byte_perm(E2M1_LOW_BYTES_0, E2M1_LOW_BYTES_1, codes);
        const uint32_t high = __byte_perm(E2M1_HIGH_BYTES_0, E2M1_HIGH_BYTES_1, codes);
        p[2 * half] = __byte_perm(low, high, 0x5140);
        p[2 * half + 1] = __byte_perm(low, high, 0x7362);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t signs = __byte_perm(even_signs, word, i << 4 | (4 + i) << 12) & 0x80008000u;
        p[i] = bf16_pair_bits(__hmul2(bf16_pair(p[i] | signs), scale2));
    }
    return make_uint4(p[0], p[1], p[2], p[3]);
}

// `dequantize8_bf16`'s weights widened to f32 (exactly).
__device__ __forceinline__ void dequantize8(uint32_t word, uint8_t scale, float* w) {
    const uint4 packed = dequantize8_bf16(word, scale);
    const uint32_t p[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[2 * i] = __uint_as_float(p[i] << 16);
        w[2 * i + 1] = __uint_as_float(p[i] & 0xFFFF0000u);
    }
}

// The 32 weights of one MXFP4 block, `dequantize8` a word at a time.
__device__ __forceinline__ void dequantize_block(const uint8_t* block, uint8_t scale, float* w) {
    const uint4 packed = *reinterpret_cast<const uint4*>(block);
    const uint32_t words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) dequantize8(words[q], scale, w + 8 * q);
}

// acc[j] = the dot product of weight row `row` (of `groups` blocks) and input row `inputs[j]`
// (`in_dim` = 32 groups wide), for the tile's pairs; every lane ends with the sums.
template <typename X>
__device__ void tile_dots(const uint8_t* blocks, const uint8_t* scales, size_t row, int groups, const X* x,
                          const int* input_rows, int count, float* acc) {
    const int lane = threadIdx.x % 32;
    const size_t in_dim = (size_t)groups * 32;
#pragma unroll
    for (int j = 0; j < MOE_TILE; ++j) acc[j] = 0.f;
    for (int g = lane; g < groups; g += 32) {
        float w[32];
        dequantize_block(blocks + (row * groups + g) * 16, scales[row * groups + g], w);
#pragma unroll
        for (int j = 0; j < MOE_TILE; ++j) {
            if (j >= count) break;
            const X* xs = x + (size_t)input_rows[j] * in_dim + (size_t)g * 32;
            float a = acc[j];
#pragma unroll
            for (int i0 = 0; i0 < 32; i0 += 8) {
                float xv[8];
                load8(xs + i0, xv);
#pragma unroll
                for (int i = 0; i < 8; ++i) a = fmaf(w[i0 + i], xv[i], a);
            }
            acc[j] = a;
        }
    }
#pragma unroll
    for (int j = 0; j < MOE_TILE; ++j) acc[j] = warp_sum(acc[j]);
}

// gpt-oss's clamped SwiGLU (limit > 0) or plain SwiGLU of a gate and an up value, biases
// added, as the CPU's kernels compute them.
__device__ __forceinline__ float swiglu_out(float g, float u, float alpha, float limit) {
    if (limit > 0.f) {
        g = fminf(g, limit);
        u = fminf(fmaxf(u, -limit), limit);
        return (u + 1.f) * (g / (1.f + expf(-g * alpha)));
    }
    return silu_times(g, u);
}

// Activations [pairs, I] (f32): for column c, gate = row c and up = row I + c of the expert's
// gate_up, each plus its bias; then gpt-oss's clamped SwiGLU (limit > 0) or plain SwiGLU, as
// the CPU's kernels compute them.
template <typename X>
__device__ void moe_gate_up(float* act, const X* x, const int* pair_rows, const uint8_t* blocks,
                            const uint8_t* scales, const float* bias, const int* tiles, const int* num_tiles,
                            int hidden, int inter, float alpha, float limit) {
    Tile t;
    if (!tile_of(tiles, num_tiles, &t)) return;
    const int c = blockIdx.x * MOE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (c >= inter) return;
    const int groups = hidden / 32;
    const int* rows = pair_rows + t.first;
    const size_t base = (size_t)t.expert * 2 * inter;
    float gate[MOE_TILE], up[MOE_TILE];
    tile_dots(blocks, scales, base + c, groups, x, rows, t.count, gate);
    tile_dots(blocks, scales, base + inter + c, groups, x, rows, t.count, up);
    if (lane >= t.count) return;
    float g = 0.f, u = 0.f;
#pragma unroll
    for (int j = 0; j < MOE_TILE; ++j)
        if (j == lane) {
            g = gate[j];
            u = up[j];
        }
    act[(size_t)(t.first + lane) * inter + c] = swiglu_out(g + bias[base + c], u + bias[base + inter + c], alpha, limit);
}

// Outputs [pairs, H] (f32): column c of the expert's down projection plus its bias.
__device__ void moe_down(float* y, const float* act, const uint8_t* blocks, const uint8_t* scales,
                         const float* bias, const int* tiles, const int* num_tiles, int hidden, int inter) {
    Tile t;
    if (!tile_of(tiles, num_tiles, &t)) return;
    const int c = blockIdx.x * MOE_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (c >= hidden) return;
    int rows[MOE_TILE];
#pragma unroll
    for (int j = 0; j < MOE_TILE; ++j) rows[j] = t.first + min(j, t.count - 1);
    const size_t row = (size_t)t.expert * hidden + c;
    float acc[MOE_TILE];
    tile_dots(blocks, scales, row, inter / 32, act, rows, t.count, acc);
    if (lane >= t.count) return;
    float v = 0.f;
#pragma unroll
    for (int j = 0; j < MOE_TILE; ++j)
        if (j == lane) v = acc[j];
    y[(size_t)(t.first + lane) * hidden + c] = v + bias[row];
}

#define MOE_GATE_UP(NAME, X)                                                                    \
    extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32)                               \
        NAME(float* act, const X* x, const int* pair_rows, const uint8_t* blocks, const uint8_t* scales, \
             const float* bias, const int* tiles, const int* num_tiles, int hidden, int inter,  \
             float alpha, float limit) {                                                        \
        moe_gate_up<X>(act, x, pair_rows, blocks, scales, bias, tiles, num_tiles, hidden, inter, alpha, \
                       limit);                                                                  \
    }

MOE_GATE_UP(moe_gate_up_f32, float)
MOE_GATE_UP(moe_gate_up_bf16, __nv_bfloat16)

extern "C" __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_f32(float* y, const float* act, const uint8_t* blocks, const uint8_t* scales, const float* bias,
                 const int* tiles, const int* num_tiles, int hidden, int inter) {
    moe_down(y, act, blocks, scales, bias, tiles, num_tiles, hidden, inter);
}

// ---- expert projections on the tensor cores (PEAGLE_CUDA_MATMUL=mma) ---------------------------

// The same projections by mma.sync, in kernels/linear_mma.cu's layout and order: a tile's pairs
// are the columns of x, eight to an mma; 16 weight rows a tile of the mma, dequantized to bf16
// as they are read (exactly: an e2m1 value times a power of two has two significant bits); the
// inner dimension in steps of one MXFP4 block (32), dealt to the block's warps in turn, each
// warp's steps in order, then the warps' sums in warp order. A pair's result depends on the
// inner dimension alone. The operands of x are bf16: the down projection's f32 activations are
// rounded to bf16 as they are read.
//
// Two forms, as linear_mma.cu has: `_mma` takes tiles of MOE_TILE pairs, `_mma_wide` tiles of
// MOE_WIDE_TILE, each weight step dequantized once for four mma of eight pairs. Dequantization
// bounds an expert projection, so where a batch gives an expert many pairs the wide form does a
// quarter of it. They differ only in how many pairs a block covers: a pair's column is the same
// chain of mma either way, so a launcher may pick either without changing a bit.

#define MOE_MMA_WARPS 8

// Eight elements of x from `p` as bf16 pairs in the operand order (f32 rounded to nearest).
__device__ __forceinline__ uint4 operand8(const __nv_bfloat16* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint4 operand8(const float* p) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        q[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    return make_uint4(q[0], q[1], q[2], q[3]);
}

// One weight row as a lane reads it, addressed once: words t of its MXFP4 blocks (a block is
// four words, eight codes each) and the blocks' scales; null past the expert's rows.
struct WeightRow {
    const uint32_t* words;
    const uint8_t* scales;
};

__device__ __forceinline__ WeightRow weight_row(const uint8_t* blocks, const uint8_t* scales, size_t row, bool real,
                                                int groups, int t) {
    if (!real) return {nullptr, nullptr};
    return {reinterpret_cast<const uint32_t*>(blocks + row * groups * 16) + t, scales + row * groups};
}

// A weight row's part of a step as read: its word of block `group` and the block's scale;
// zeros past the expert's rows or the inner dimension.
struct RowPart {
    uint32_t word;
    uint8_t scale;
};

__device__ __forceinline__ RowPart row_part(const WeightRow& row, int group, bool in_k) {
    if (!in_k || !row.words) return {0u, (uint8_t)0};
    return {row.words[4 * group], row.scales[group]};
}

// d[h][e] += the tile of weight rows `rows[h]` .. + 16 (each a row of `groups` MXFP4 blocks;
// rows at or past `real_rows` read as zeros) times eight e of the tile's pairs (`x_rows[e]`:
// the row of x of this lane's pair among them, null past the tile's pairs), for H tiles of rows
// and the first `live` of E eights of pairs; every lane ends with its accumulator fragments,
// this warp's steps summed. DEPTH steps of loads are in flight a warp; it changes when a load
// is issued, never the order of the mma.
template <int H, int E, int DEPTH, typename X>
__device__ void mma_tile_dots(const uint8_t* blocks, const uint8_t* scales, const size_t* rows, int real_rows,
                              int first_row, int groups, const X* const* x_rows, int live, float (*d)[E][4]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    WeightRow lo_rows[H], hi_rows[H];
#pragma unroll
    for (int h = 0; h < H; ++h) {
        lo_rows[h] = weight_row(blocks, scales, rows[h] + g, first_row + g < real_rows, groups, t);
        hi_rows[h] = weight_row(blocks, scales, rows[h] + g + 8, first_row + g + 8 < real_rows, groups, t);
    }
    const X* x_lane[E];
#pragma unroll
    for (int e = 0; e < E; ++e) x_lane[e] = x_rows[e] ? x_rows[e] + 8 * t : nullptr;
    for (int first = warp; first < groups; first += DEPTH * MOE_MMA_WARPS) {
        RowPart lo[DEPTH][H], hi[DEPTH][H];
        uint4 b[DEPTH][E];
#pragma unroll
        for (int s = 0; s < DEPTH; ++s) {
            const int group = first + s * MOE_MMA_WARPS;
            const bool in_k = group < groups;
#pragma unroll
            for (int h = 0; h < H; ++h) {
                lo[s][h] = row_part(lo_rows[h], group, in_k);
                hi[s][h] = row_part(hi_rows[h], group, in_k);
            }
#pragma unroll
            for (int e = 0; e < E; ++e)
                b[s][e] = in_k && x_lane[e] ? operand8(x_lane[e] + (size_t)group * 32) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int s = 0; s < DEPTH; ++s) {
            if (first + s * MOE_MMA_WARPS >= groups) break;
#pragma unroll
            for (int h = 0; h < H; ++h) {
                const uint4 a0 = dequantize8_bf16(lo[s][h].word, lo[s][h].scale);
                const uint4 a1 = dequantize8_bf16(hi[s][h].word, hi[s][h].scale);
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    if (e >= live) break;
                    mma_step(d[h][e], a0, a1, b[s][e]);
                }
            }
        }
    }
}

// The warps' accumulators of H tiles of 16 rows by the tile's 8E pairs, summed in warp order
// into sums[h][pair][row] (shared): every thread may read them after the call.
template <int H, int E>
__device__ void sum_warps(float (*d)[E][4], float (*partial)[H][8 * E][17], float (*sums)[8 * E][17]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
        for (int e = 0; e < E; ++e)
#pragma unroll
            for (int i = 0; i < 4; ++i) partial[warp][h][8 * e + 2 * t + (i & 1)][g + 8 * (i >> 1)] = d[h][e][i];
    __syncthreads();
    for (int i = threadIdx.x; i < H * 8 * E * 16; i += blockDim.x) {
        const int h = i / (8 * E * 16), pair = i / 16 % (8 * E), row = i % 16;
        float sum = partial[0][h][pair][row];
#pragma unroll
        for (int v = 1; v < MOE_MMA_WARPS; ++v) sum += partial[v][h][pair][row];
        sums[h][pair][row] = sum;
    }
    __syncthreads();
}

// As moe_gate_up, for 16 columns and a tile of up to 8E pairs a block: gate rows c0 .. c0 + 16
// and up rows I + c0 .. .
template <int E, int DEPTH>
__device__ void gate_up_mma_tile(float* act, const __nv_bfloat16* x, const int* pair_rows, const uint8_t* blocks,
                                const uint8_t* scales, const float* bias, const int* tiles, const int* num_tiles,
                                int hidden, int inter, float alpha, float limit) {
    __shared__ float partial[MOE_MMA_WARPS][2][8 * E][17];
    __shared__ float sums[2][8 * E][17];
    Tile t;
    if (!tile_of(tiles, num_tiles, &t)) return;
    const int c0 = blockIdx.x * 16, g = threadIdx.x % 32 / 4;
    const size_t base = (size_t)t.expert * 2 * inter;
    const size_t rows[2] = {base + c0, base + inter + c0};
    const __nv_bfloat16* x_rows[E];
    float d[2][E][4];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int pair = 8 * e + g;
        x_rows[e] = pair < t.count ? x + (size_t)pair_rows[t.first + pair] * hidden : nullptr;
#pragma unroll
        for (int i = 0; i < 4; ++i) d[0][e][i] = d[1][e][i] = 0.f;
    }
    mma_tile_dots<2, E, DEPTH>(blocks, scales, rows, inter, c0, hidden / 32, x_rows, (t.count + 7) / 8, d);
    sum_warps<2, E>(d, partial, sums);
    for (int i = threadIdx.x; i < 8 * E * 16; i += blockDim.x) {
        const int pair = i / 16, c = c0 + i % 16;
        if (pair >= t.count || c >= inter) continue;
        const float gate = sums[0][pair][i % 16] + bias[base + c], up = sums[1][pair][i % 16] + bias[base + inter + c];
        act[(size_t)(t.first + pair) * inter + c] = swiglu_out(gate, up, alpha, limit);
    }
}

// As moe_down, for 16 columns and a tile of up to 8E pairs a block.
template <int E, int DEPTH>
__device__ void down_mma_tile(float* y, const float* act, const uint8_t* blocks, const uint8_t* scales,
                             const float* bias, const int* tiles, const int* num_tiles, int hidden, int inter) {
    __shared__ float partial[MOE_MMA_WARPS][1][8 * E][17];
    __shared__ float sums[1][8 * E][17];
    Tile t;
    if (!tile_of(tiles, num_tiles, &t)) return;
    const int c0 = blockIdx.x * 16, g = threadIdx.x % 32 / 4;
    const size_t rows[1] = {(size_t)t.expert * hidden + c0};
    const float* x_rows[E];
    float d[1][E][4];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int pair = 8 * e + g;
        x_rows[e] = pair < t.count ? act + (size_t)(t.first + pair) * inter : nullptr;
#pragma unroll
        for (int i = 0; i < 4; ++i) d[0][e][i] = 0.f;
    }
    mma_tile_dots<1, E, DEPTH>(blocks, scales, rows, hidden, c0, inter / 32, x_rows, (t.count + 7) / 8, d);
    sum_warps<1, E>(d, partial, sums);
    for (int i = threadIdx.x; i < 8 * E * 16; i += blockDim.x) {
        const int pair = i / 16, c = c0 + i % 16;
        if (pair >= t.count || c >= hidden) continue;
        y[(size_t)(t.first + pair) * hidden + c] = sums[0][pair][i % 16] + bias[(size_t)t.expert * hidden + c];
    }
}

// Narrow tiles keep four steps of loads in flight a warp; wide ones, with four times the
// operands of x a step, two. The narrow gate_up is held to three blocks an SM where that fits
// in 80 registers without spills (sm_80, sm_90; not sm_100), not the two its 100 registers
// allow: a decode step's few pairs leave its warps waiting on loads, and more warps hide more
// of that wait.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define MOE_NARROW_GATE_UP_BLOCKS 2
#else
#define MOE_NARROW_GATE_UP_BLOCKS 3
#endif
#define MOE_MMA_GATE_UP(SUFFIX, E, DEPTH, BOUNDS)                                              \
    extern "C" __global__ void __launch_bounds__ BOUNDS                                        \
        moe_gate_up_mma##SUFFIX(float* act, const __nv_bfloat16* x, const int* pair_rows, const uint8_t* blocks, \
                                const uint8_t* scales, const float* bias, const int* tiles,   \
                                const int* num_tiles, int hidden, int inter, float alpha, float limit) { \
        gate_up_mma_tile<E, DEPTH>(act, x, pair_rows, blocks, scales, bias, tiles, num_tiles, hidden, inter, \
                                   alpha, limit);                                              \
    }
#define MOE_MMA_DOWN(SUFFIX, E, DEPTH)                                                         \
    extern "C" __global__ void __launch_bounds__(MOE_MMA_WARPS * 32)                           \
        moe_down_mma##SUFFIX(float* y, const float* act, const uint8_t* blocks, const uint8_t* scales, \
                             const float* bias, const int* tiles, const int* num_tiles, int hidden, int inter) { \
        down_mma_tile<E, DEPTH>(y, act, blocks, scales, bias, tiles, num_tiles, hidden, inter); \
    }

MOE_MMA_GATE_UP(, MOE_TILE / 8, 4, (MOE_MMA_WARPS * 32, MOE_NARROW_GATE_UP_BLOCKS))
MOE_MMA_DOWN(, MOE_TILE / 8, 4)
MOE_MMA_GATE_UP(_wide, MOE_WIDE_TILE / 8, 2, (MOE_MMA_WARPS * 32))
MOE_MMA_DOWN(_wide, MOE_WIDE_TILE / 8, 2)

// ---- combine -----------------------------------------------------------------------------------

// out[row] = the sum over ranks, in rank order, of weight * the expert's output, each product
// rounded before its addition as the CPU does. A row's columns are dealt to gridDim.y blocks.
template <typename T>
__device__ void moe_combine(T* out, const float* y, const float* weights, const int* pair_of, int hidden, int k) {
    const int row = blockIdx.x;
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < hidden; c += gridDim.y * blockDim.x) {
        float o = 0.f;
        for (int rank = 0; rank < k; ++rank) {
            const int p = pair_of[row * k + rank];
            o = __fadd_rn(o, __fmul_rn(weights[row * k + rank], y[(size_t)p * hidden + c]));
        }
        out[(size_t)row * hidden + c] = from_f32<T>(o);
    }
}

#define MOE_COMBINE(NAME, T)                                                                   \
    extern "C" __global__ void NAME(T* out, const float* y, const float* weights, const int* pair_of, \
                                    int hidden, int k) {                                       \
        moe_combine<T>(out, y, weights, pair_of, hidden, k);                                   \
    }

MOE_COMBINE(moe_combine_f32, float)
MOE_COMBINE(moe_combine_bf16, __nv_bfloat16)

// gpt-oss's MXFP4 expert projections on the tensor cores (the default matmul), over the tiles
// of pairs that moe.cu's routing lists: moe_gate_up_mma and moe_down_mma compute what
// moe_mxfp4.cu's moe_gate_up and moe_down do, by mma.sync, in kernels/linear_mma.cu's
// fragment layout (mma.cuh) from the weights in mxfp4.cuh's order: a tile's pairs
// are the columns of x, eight to an mma; 16 weight rows a tile of the mma, dequantized to bf16
// as they are read (exactly: an e2m1 value times a power of two has two significant bits). The
// inner dimension goes in quads of MOE_LAYOUT_QUAD MXFP4 blocks (128 elements), quad q to warp
// q % MOE_MMA_WARPS, each warp's quads in order, then the warps' sums in warp order. Lane
// (g, t) reads the whole of block 4q + t of its weight rows g and g + 8 (one 16-byte load each,
// the device layout's quads making a warp's load 512 contiguous bytes) and elements 32t ..
// 32t + 32 of the quad from its column of x; mma j of the quad's four (two m16n8k16 each,
// mma.cuh's `mma_step`) takes word j of each lane's block, elements 8j .. 8j + 8 of it, on
// both sides: a permutation of the inner dimension, the same for both operands. A pair's
// result depends on the inner dimension alone. The operands of x are bf16: the down
// projection's f32 activations are rounded to bf16 as they are read.
//
// Two forms, as linear_mma.cu has: `_mma` takes tiles of MOE_TILE pairs, `_mma_wide` tiles of
// MOE_WIDE_TILE, each weight quad dequantized once for four mma of eight pairs. Dequantization
// bounds an expert projection of many pairs, so where a batch gives an expert many the wide form
// does a quarter of it. They differ only in how many pairs a block covers: a pair's column is
// the same chain of mma either way, so a launcher may pick either without changing a bit.
#include "common.cuh"
#include "mma.cuh"
#include "moe.cuh"
#include "mxfp4.cuh"

#define MOE_MMA_WARPS 8
#if MOE_LAYOUT_QUAD != 4 || MOE_LAYOUT_ROWS != 16
#error "a quad is the blocks of an mma fragment's four lanes t, a layout tile its 16 rows"
#endif

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

// A lane's weight row as its quads' blocks lie in the device layout: where its block t of quad
// 0 would be were that quad whole, how far each quad's is from the last's, and how much nearer
// a short last quad's is (quad 0 too, where it is the only one); or none, past the expert's rows.
struct LaneRow {
    const uint8_t* codes;
    const uint8_t* scales;
    int quad_stride, short_quad_shift;
};

__device__ __forceinline__ LaneRow lane_row(const ExpertWeight& weight, int row) {
    if (row < 0) return {nullptr, nullptr, 0, 0};
    const RowBlocks at = row_blocks(weight.rows, weight.groups, row);
    const size_t first = at.tile_first + (size_t)at.in_tile * MOE_LAYOUT_QUAD + threadIdx.x % 4;
    const int last_quad_blocks = weight.groups - (weight.groups - 1) / MOE_LAYOUT_QUAD * MOE_LAYOUT_QUAD;
    return {weight.blocks + 16 * first, weight.scales + first, MOE_LAYOUT_QUAD * at.tile_rows,
            at.in_tile * (last_quad_blocks - MOE_LAYOUT_QUAD)};
}

// A lane's part of quad `quad` (of `quads`) of its row: block 4 quad + t and its scale; zeros
// past the row's blocks (`has_block` false) or the expert's rows.
struct QuadPart {
    uint4 codes;
    uint8_t scale;
};

__device__ __forceinline__ QuadPart quad_part(const LaneRow& row, int quad, int quads, bool has_block) {
    if (!row.codes || !has_block) return {make_uint4(0, 0, 0, 0), (uint8_t)0};
    const int block = quad * row.quad_stride + (quad == quads - 1 ? row.short_quad_shift : 0);
    return {*reinterpret_cast<const uint4*>(row.codes + 16 * block), row.scales[block]};
}

// Word j of a block's codes.
__device__ __forceinline__ uint32_t codes_word(const uint4& codes, int j) {
    return j == 0 ? codes.x : j == 1 ? codes.y : j == 2 ? codes.z : codes.w;
}

// A quad's four mma_steps for each tile of rows h and eight of pairs e, from the lane's parts
// of the quad (`lo`, `hi`) and its column of x from element k; SMALL_SCALE where every part's
// scale is at most 128 (`dequantize8_bf16`), which the warp decides as one so as to branch.
template <bool SMALL_SCALE, int H, int E, typename X>
__device__ __forceinline__ void quad_mma(const QuadPart (&lo)[H], const QuadPart (&hi)[H], const X* const* x_rows,
                                         size_t k, bool has_block, int live, float (*d)[E][4]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint4 b[E];
#pragma unroll
        for (int e = 0; e < E; ++e)
            b[e] = e < live && has_block && x_rows[e] ? operand8(x_rows[e] + k + 8 * j) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int h = 0; h < H; ++h) {
            const uint4 a0 = dequantize8_bf16<SMALL_SCALE>(codes_word(lo[h].codes, j), lo[h].scale);
            const uint4 a1 = dequantize8_bf16<SMALL_SCALE>(codes_word(hi[h].codes, j), hi[h].scale);
#pragma unroll
            for (int e = 0; e < E; ++e) {
                if (e >= live) break;
                mma_step(d[h][e], a0, a1, b[e]);
            }
        }
    }
}

// d[h][e] += the tile of `weight`'s rows lo_rows[h] and hi_rows[h] (this lane's rows g and
// g + 8 of tile h; -1 past the expert's rows, which read as zeros) times eight e of the tile's
// pairs (`x_rows[e]`: the row of x of this lane's pair among them, null past the tile's pairs),
// for H tiles of rows and the first `live` of E eights of pairs; every lane ends with its
// accumulator fragments, this warp's quads summed. A warp's quads come DEPTH at a time, the
// weights of all of them loaded before the first is used, so that the warp has DEPTH quads of
// loads in flight (at gpt-oss's 2880, a warp's 3 quads are one round of loads); their mma then
// run in quad order, so a pair's result is the same at any DEPTH. Its x is loaded an mma at a
// time: x is read by every block of the launch, so it is mostly in cache, and the weights are
// what must be in flight.
template <int H, int E, int DEPTH, typename X>
__device__ void mma_tile_dots(const ExpertWeight& weight, const int (&lo_rows)[H], const int (&hi_rows)[H],
                              const X* const* x_rows, int live, float (*d)[E][4]) {
    const int warp = threadIdx.x / 32, t = threadIdx.x % 4;
    const int quads = (weight.groups + MOE_LAYOUT_QUAD - 1) / MOE_LAYOUT_QUAD;
    LaneRow lo_lane[H], hi_lane[H];
#pragma unroll
    for (int h = 0; h < H; ++h) {
        lo_lane[h] = lane_row(weight, lo_rows[h]);
        hi_lane[h] = lane_row(weight, hi_rows[h]);
    }
    for (int first = warp; first < quads; first += DEPTH * MOE_MMA_WARPS) {
        QuadPart lo[DEPTH][H], hi[DEPTH][H];
#pragma unroll
        for (int s = 0; s < DEPTH; ++s) {
            const int quad = first + s * MOE_MMA_WARPS;
            const bool has_block = quad < quads && MOE_LAYOUT_QUAD * quad + t < weight.groups;
#pragma unroll
            for (int h = 0; h < H; ++h) {
                lo[s][h] = quad_part(lo_lane[h], quad, quads, has_block);
                hi[s][h] = quad_part(hi_lane[h], quad, quads, has_block);
            }
        }
#pragma unroll
        for (int s = 0; s < DEPTH; ++s) {
            const int quad = first + s * MOE_MMA_WARPS;
            if (quad >= quads) break;
            const bool has_block = MOE_LAYOUT_QUAD * quad + t < weight.groups;
            const size_t k = (size_t)quad * MOE_LAYOUT_QUAD * 32 + 32 * t;
            bool small = true;
#pragma unroll
            for (int h = 0; h < H; ++h) small = small && lo[s][h].scale <= 128 && hi[s][h].scale <= 128;
            if (__all_sync(0xffffffff, small))
                quad_mma<true, H, E>(lo[s], hi[s], x_rows, k, has_block, live, d);
            else
                quad_mma<false, H, E>(lo[s], hi[s], x_rows, k, has_block, live, d);
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
    const bool lo_real = c0 + g < inter, hi_real = c0 + g + 8 < inter;
    const int lo_rows[2] = {lo_real ? c0 + g : -1, lo_real ? inter + c0 + g : -1};
    const int hi_rows[2] = {hi_real ? c0 + g + 8 : -1, hi_real ? inter + c0 + g + 8 : -1};
    const __nv_bfloat16* x_rows[E];
    float d[2][E][4];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int pair = 8 * e + g;
        x_rows[e] = pair < t.count ? x + (size_t)pair_rows[t.first + pair] * hidden : nullptr;
#pragma unroll
        for (int i = 0; i < 4; ++i) d[0][e][i] = d[1][e][i] = 0.f;
    }
    mma_tile_dots<2, E, DEPTH>(expert_weight(blocks, scales, t.expert, 2 * inter, hidden / 32), lo_rows, hi_rows,
                               x_rows, (t.count + 7) / 8, d);
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
    const int lo_rows[1] = {c0 + g < hidden ? c0 + g : -1}, hi_rows[1] = {c0 + g + 8 < hidden ? c0 + g + 8 : -1};
    const float* x_rows[E];
    float d[1][E][4];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        const int pair = 8 * e + g;
        x_rows[e] = pair < t.count ? act + (size_t)(t.first + pair) * inter : nullptr;
#pragma unroll
        for (int i = 0; i < 4; ++i) d[0][e][i] = 0.f;
    }
    mma_tile_dots<1, E, DEPTH>(expert_weight(blocks, scales, t.expert, hidden, inter / 32), lo_rows, hi_rows, x_rows,
                               (t.count + 7) / 8, d);
    sum_warps<1, E>(d, partial, sums);
    for (int i = threadIdx.x; i < 8 * E * 16; i += blockDim.x) {
        const int pair = i / 16, c = c0 + i % 16;
        if (pair >= t.count || c >= hidden) continue;
        y[(size_t)(t.first + pair) * hidden + c] = sums[0][pair][i % 16] + bias[(size_t)t.expert * hidden + c];
    }
}

#define MOE_MMA_GATE_UP(SUFFIX, E, DEPTH)                                                             \
    extern "C" __global__ void __launch_bounds__(MOE_MMA_WARPS * 32)                           \
        moe_gate_up_mma##SUFFIX(float* act, const __nv_bfloat16* x, const int* pair_rows, const uint8_t* blocks, \
                                const uint8_t* scales, const float* bias, const int* tiles,   \
                                const int* num_tiles, int hidden, int inter, float alpha, float limit) { \
        gate_up_mma_tile<E, DEPTH>(act, x, pair_rows, blocks, scales, bias, tiles, num_tiles, hidden, inter, alpha, \
                            limit);                                                            \
    }
#define MOE_MMA_DOWN(SUFFIX, E, DEPTH)                                                                \
    extern "C" __global__ void __launch_bounds__(MOE_MMA_WARPS * 32)                           \
        moe_down_mma##SUFFIX(float* y, const float* act, const uint8_t* blocks, const uint8_t* scales, \
                             const float* bias, const int* tiles, const int* num_tiles, int hidden, int inter) { \
        down_mma_tile<E, DEPTH>(y, act, blocks, scales, bias, tiles, num_tiles, hidden, inter);         \
    }

// The narrow forms serve decode steps, whose few pairs leave the weights' latency the bound:
// three quads of loads in flight a warp. The wide forms' four eights of pairs take the
// registers that would hold them.
MOE_MMA_GATE_UP(, MOE_TILE / 8, 3)
MOE_MMA_DOWN(, MOE_TILE / 8, 3)
MOE_MMA_GATE_UP(_wide, MOE_WIDE_TILE / 8, 1)
MOE_MMA_DOWN(_wide, MOE_WIDE_TILE / 8, 1)

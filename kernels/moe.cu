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
// Expert weights, per expert as loaded: `blocks` [out, in / 32, 16] bytes, two e2m1 values a
// byte (low nibble first), and `scales` [out, in / 32], each scaling 32 values by 2^(e - 127);
// gate_up's rows are the I gate rows, then the I up rows. The device keeps them in its own
// order (`block_index`, below) and dequantizes them in registers as read.
//
// Batch invariance: one warp computes one output column for the pairs of its tile; lane l sums
// MXFP4 blocks l, l + 32, ... of the inner dimension in order, 32 products each (their inputs
// read 8 at a time by vector loads: rows start 16-byte aligned), then the warp reduces by a
// fixed butterfly. The order depends on the inner dimension alone, so a pair's
// result is the same whatever other pairs, rows or experts share the launch.
#include "common.cuh"
#include "mma.cuh"
#include "moe.cuh"

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

// The pairs grouped by expert, by one block of whole warps: `pair_rows[p]` is the row of sorted
// pair p and `pair_of[row * k + rank]` its index, each expert's pairs in (row, rank) order.
// Tiles list each expert's pairs `tile` at a time: `tiles[3 t ..]` = (expert, first pair,
// pairs); `num_tiles[0]` says how many there are. Warp w takes experts w, w + warps, ...; its
// lanes look at 32 pairs at a time, and a ballot counts the expert's among them, then places
// each at the count of those before it. Warp 0 sums the counts (and the tiles they make) by
// warp scans, 32 experts at a time.
__device__ void group_pairs(const int* ids, int pairs, int experts, int* pair_rows, int* pair_of, int* tiles,
                            int* num_tiles, int k, int tile) {
    __shared__ int counts[MOE_MAX_EXPERTS], offsets[MOE_MAX_EXPERTS], first_tiles[MOE_MAX_EXPERTS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int e = warp; e < experts; e += warps) {
        int n = 0;
        for (int i = lane; i - lane < pairs; i += 32) n += __popc(__ballot_sync(0xffffffffu, i < pairs && ids[i] == e));
        if (lane == 0) counts[e] = n;
    }
    __syncthreads();
    if (warp == 0) {
        int pairs_before = 0, tiles_before = 0;
        for (int e = lane; e - lane < experts; e += 32) {
            const int n = e < experts ? counts[e] : 0, t = (n + tile - 1) / tile;
            int n_through = n, t_through = t;
            for (int d = 1; d < 32; d *= 2) {
                const int n_below = __shfl_up_sync(0xffffffffu, n_through, d);
                const int t_below = __shfl_up_sync(0xffffffffu, t_through, d);
                if (lane >= d) {
                    n_through += n_below;
                    t_through += t_below;
                }
            }
            if (e < experts) {
                offsets[e] = pairs_before + n_through - n;
                first_tiles[e] = tiles_before + t_through - t;
            }
            pairs_before += __shfl_sync(0xffffffffu, n_through, 31);
            tiles_before += __shfl_sync(0xffffffffu, t_through, 31);
        }
        if (lane == 0) num_tiles[0] = tiles_before;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < experts; e += blockDim.x)
        for (int first = 0, t = first_tiles[e]; first < counts[e]; first += tile, ++t) {
            tiles[3 * t] = e;
            tiles[3 * t + 1] = offsets[e] + first;
            tiles[3 * t + 2] = min(tile, counts[e] - first);
        }
    for (int e = warp; e < experts; e += warps) {
        int next = offsets[e];
        for (int i = lane; i - lane < pairs; i += 32) {
            const bool mine = i < pairs && ids[i] == e;
            const uint32_t ballot = __ballot_sync(0xffffffffu, mine);
            if (mine) {
                const int p = next + __popc(ballot & ((1u << lane) - 1));
                pair_rows[p] = i / k;
                pair_of[i] = p;
            }
            next += __popc(ballot);
        }
    }
}

// Routing and grouping in one launch of one block of MOE_ROUTE_THREADS: its warps route rows
// warp, warp + 32, ... (`route_row`), then, once every row's experts are written (a barrier
// makes a block's global writes visible to the whole block), it groups the pairs
// (`group_pairs`), a warp an expert. A decode step's few rows would leave a launch of their
// own mostly waiting. A launch is one block, which the bound says: without it ptxas holds
// sm_100 to 32 registers and spills.
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
    extern "C" __global__ void __launch_bounds__(MOE_ROUTE_THREADS, 1)                         \
        NAME(const T* logits, int rows, int experts, int k, int normalize, int* ids, float* weights, \
             int* pair_rows, int* pair_of, int* tiles, int* num_tiles, int tile) {              \
        moe_route_group<T>(logits, rows, experts, k, normalize, ids, weights, pair_rows, pair_of, tiles, \
                           num_tiles, tile);                                                    \
    }

MOE_ROUTE_GROUP(moe_route_group_f32, float)
MOE_ROUTE_GROUP(moe_route_group_bf16, __nv_bfloat16)

// ---- the experts' weights on the device ----------------------------------------------------------

// Each expert's weight [rows, groups] (its blocks and its scales alike) is kept in tiles of
// MOE_LAYOUT_ROWS rows, tile after tile; a tile's blocks in quads of MOE_LAYOUT_QUAD
// consecutive blocks of a row, quad after quad, and a quad's rows in order. The tensor-core
// kernels read a quad of 8 rows a warp load, 16 bytes a lane (a whole block), so that load
// reads 512 contiguous bytes and the blocks' scales 32, where the checkpoint's order would
// scatter both over 8 rows. A row's last quad (and an expert's last tile) may be shorter:
// `block_index` is where block `group` of row `row` lies, counted in blocks from the expert's
// first. Every expert's weight has rows * groups blocks, as loaded. Within each 4-byte word of
// a block, each code's bits are moved too (`MOE_CODE_BITS`, for `dequantize8_bf16`).
// `moe_lay_out` puts the checkpoint's weights in this order once, on upload.
#define MOE_LAYOUT_ROWS 16
#define MOE_LAYOUT_QUAD 4

// Where row `row`'s blocks lie in a weight [rows, groups]: `block_index` with the row's part
// worked out once.
struct RowBlocks {
    size_t tile_first;
    int tile_rows, in_tile, groups;

    __device__ __forceinline__ size_t at(int group) const {
        const int quad = group / MOE_LAYOUT_QUAD;
        const int quad_blocks = min(MOE_LAYOUT_QUAD, groups - quad * MOE_LAYOUT_QUAD);
        return tile_first + (size_t)quad * MOE_LAYOUT_QUAD * tile_rows + in_tile * quad_blocks +
               group % MOE_LAYOUT_QUAD;
    }
};

__device__ __forceinline__ RowBlocks row_blocks(int rows, int groups, int row) {
    const int tile = row / MOE_LAYOUT_ROWS;
    return {(size_t)tile * MOE_LAYOUT_ROWS * groups, min(MOE_LAYOUT_ROWS, rows - tile * MOE_LAYOUT_ROWS),
            row % MOE_LAYOUT_ROWS, groups};
}

__device__ __forceinline__ size_t block_index(int rows, int groups, int row, int group) {
    return row_blocks(rows, groups, row).at(group);
}

// Where the bits of code k of a checkpoint's word (nibble k, low nibble first; its bits m, e0,
// e1 and the sign) lie in the device's word. `dequantize8_bf16` reads codes 2i and 2i + 1 as
// the low and high halves of a bf16 pair: each code's magnitude (e1 e0 m) at bits 8..6 of its
// half and its sign at bit 15. Pair 0 lies there already, pair 1 4 bits below, pair 2 10 (a
// rotation); pair 3 takes the bits left, its magnitudes' top bits 2 above their places and the
// rest 6 below. scripts/mma_layout_test.py reads this table to check the rotations against it.
#define MOE_CODE_BITS                                                                           \
    {6, 7, 8, 15}, {22, 23, 24, 31}, {2, 3, 4, 11}, {18, 19, 20, 27}, {28, 29, 30, 5}, {12, 13, 14, 21}, \
        {0, 1, 10, 9}, {16, 17, 26, 25}

__device__ __forceinline__ uint32_t device_word(uint32_t word) {
    const uint8_t places[8][4] = {MOE_CODE_BITS};
    uint32_t moved = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int b = 0; b < 4; ++b) moved |= (word >> (4 * k + b) & 1u) << places[k][b];
    return moved;
}

// `experts` weights [rows, groups] end to end, from the checkpoint's order (`from_codes`,
// `from_scales`) to the device's, a thread a block.
extern "C" __global__ void moe_lay_out(uint8_t* codes, uint8_t* scales, const uint8_t* from_codes,
                                       const uint8_t* from_scales, int experts, int rows, int groups) {
    const long long per_expert = (long long)rows * groups, blocks = per_expert * experts;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < blocks;
         i += (long long)gridDim.x * blockDim.x) {
        const long long in_expert = i % per_expert;
        const size_t to = (size_t)(i - in_expert) + block_index(rows, groups, (int)(in_expert / groups),
                                                                (int)(in_expert % groups));
        const uint4 word = *reinterpret_cast<const uint4*>(from_codes + 16 * i);
        *reinterpret_cast<uint4*>(codes + 16 * to) =
            make_uint4(device_word(word.x), device_word(word.y), device_word(word.z), device_word(word.w));
        scales[to] = from_scales[i];
    }
}

// One expert's weight as the kernels address it: its first block and scale, rows and groups.
struct ExpertWeight {
    const uint8_t* blocks;
    const uint8_t* scales;
    int rows, groups;
};

__device__ __forceinline__ ExpertWeight expert_weight(const uint8_t* blocks, const uint8_t* scales, int expert,
                                                      int rows, int groups) {
    const size_t first = (size_t)expert * rows * groups;
    return {blocks + 16 * first, scales + first, rows, groups};
}

// ---- expert projections ------------------------------------------------------------------------

// The eight weights of a word of an MXFP4 block with scale `scale`, as bf16 pairs in order
// (pair i: weights 2i and 2i + 1, the first in the low half): each e2m1 value times
// 2^(scale - 127), where scale 0 is the subnormal 2^-127 and 255 infinity, as the CPU's table
// has them.
//
// The word is as the device keeps it (MOE_CODE_BITS), its codes' bits moved so that each
// pair's come out where a bf16 pair wants them by a rotation and a mask: a code's sign at bit
// 15 of its half and its three magnitude bits (e1 e0 m) at bits 8..6, which makes a bf16 of
// exactly its value times 2^-126 (e = 0: the subnormal m 2^-127; else 2^(e - 127) (1 + m / 2)).
// Pair 0 lies in place, pair 1 four bits further, pair 2 ten; pair 3 fills the rest, its
// magnitudes' top bits two above the others'. Then each pair is multiplied by 2^(scale - 1), a
// bf16 where scale <= 128 (SMALL_SCALE: the caller's promise); else by 2^126 and then by
// 2^(scale - 127). Each product is exact: an e2m1 value times a power of two has two
// significant bits, and bf16 has f32's range, subnormals included (a product past it
// overflows to infinity, as the CPU's f32 does). Every instruction here counts: where a
// projection has few rows, dequantization, not memory, bounds it.
#define E2M1_PAIR_BITS 0x81C081C0u
template <bool SMALL_SCALE>
__device__ __forceinline__ uint4 dequantize8_bf16(uint32_t word, uint8_t scale) {
    const uint32_t p[4] = {
        word & E2M1_PAIR_BITS,
        __funnelshift_l(word, word, 4) & E2M1_PAIR_BITS,
        __funnelshift_l(word, word, 10) & E2M1_PAIR_BITS,
        (__funnelshift_l(word, word, 6) & 0x80C080C0u) | (__funnelshift_l(word, word, 30) & 0x01000100u),
    };
    const uint32_t factor_bits = SMALL_SCALE ? ((uint32_t)scale + 126) << 7 : max((uint32_t)scale << 7, 0x40u);
    const __nv_bfloat162 factor = bf16_pair(factor_bits | factor_bits << 16);
    const __nv_bfloat162 unbias = bf16_pair(0x7E807E80u);  // 2^126, twice
    uint32_t q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        q[i] = bf16_pair_bits(__hmul2(SMALL_SCALE ? bf16_pair(p[i]) : __hmul2(bf16_pair(p[i]), unbias), factor));
    return make_uint4(q[0], q[1], q[2], q[3]);
}

// `dequantize8_bf16`'s weights widened to f32 (exactly).
__device__ __forceinline__ void dequantize8(uint32_t word, uint8_t scale, float* w) {
    const uint4 packed = dequantize8_bf16<false>(word, scale);
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

// acc[j] = the dot product of row `row` of `weight` and input row `input_rows[j]` (the
// weight's groups * 32 wide), for the tile's pairs; every lane ends with the sums.
template <typename X>
__device__ void tile_dots(const ExpertWeight& weight, int row, const X* x, const int* input_rows, int count,
                          float* acc) {
    const int lane = threadIdx.x % 32;
    const size_t in_dim = (size_t)weight.groups * 32;
#pragma unroll
    for (int j = 0; j < MOE_TILE; ++j) acc[j] = 0.f;
    const RowBlocks row_at = row_blocks(weight.rows, weight.groups, row);
    for (int g = lane; g < weight.groups; g += 32) {
        const size_t block = row_at.at(g);
        float w[32];
        dequantize_block(weight.blocks + 16 * block, weight.scales[block], w);
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
    const int* rows = pair_rows + t.first;
    const size_t base = (size_t)t.expert * 2 * inter;
    const ExpertWeight weight = expert_weight(blocks, scales, t.expert, 2 * inter, hidden / 32);
    float gate[MOE_TILE], up[MOE_TILE];
    tile_dots(weight, c, x, rows, t.count, gate);
    tile_dots(weight, inter + c, x, rows, t.count, up);
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
    tile_dots(expert_weight(blocks, scales, t.expert, hidden, inter / 32), c, act, rows, t.count, acc);
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

// The same projections by mma.sync, in kernels/linear_mma.cu's fragment layout: a tile's pairs
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

// The tensor-core matrix product's core, shared by kernels/linear_mma.cu's plain forms and
// kernels/moe_dense.cu's expert projections: the weight types a lane loads and turns into
// operands, the block's partial sums of 16-row weight tiles by 8-row groups of x, step by step
// of the inner dimension (`mma_partials`), their sum in warp order (`block_sum`), and how an
// element is finished (bias, rounding, SwiGLU). linear_mma.cu's first comment states the
// chain of operations and why it is batch invariant; it holds for every kernel built on these.
#pragma once
#include "common.cuh"
#include "mma.cuh"

#define MMA_WARPS 8
#define MMA_STEP 32

// A weight type of the mma kernels: how a lane loads its 8 elements of a step (`Loaded`,
// zeros for a row past the matrix) and turns them into the step's bf16 operand, and whether a
// step's products are scaled by their block's scale.
struct Bf16Weights {
    using Element = __nv_bfloat16;
    using Loaded = uint4;
    static constexpr bool SCALED = false;
    static __device__ __forceinline__ uint4 load(const __nv_bfloat16* base, int row, int rows, int K, int k) {
        if (row >= rows) return make_uint4(0, 0, 0, 0);
        return *reinterpret_cast<const uint4*>(base + (size_t)row * K + k);
    }
    static __device__ __forceinline__ uint4 operand(const uint4& loaded) { return loaded; }
};

// Eight e4m3 values (a lane's of a step, in memory order) as bf16 pairs in order, exactly:
// each code's sign goes to bit 15 of its half and its seven magnitude bits (eeeemmm) to bits
// 13..7 down, which reads as 2^-120 times its value (a normal's 2^(e - 127) (1 + m / 8), a
// subnormal's 2^-126 m / 8, against e4m3's 2^(e - 7) (1 + m / 8) and 2^-6 m / 8); then times
// 2^120, exact in bf16. e4m3's NaN codes, which no checkpoint holds, read as +-480.
__device__ __forceinline__ uint4 e4m3_bf16x8(const uint2& codes) {
    const __nv_bfloat162 unbias = bf16_pair(0x7B807B80u);  // 2^120, twice
    const uint32_t words[2] = {codes.x, codes.y};
    uint32_t pairs[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint32_t word = words[i / 2] >> (16 * (i % 2));
        const uint32_t spread = (word & 0xFFu) | (word & 0xFF00u) << 8;  // codes 2i, 2i + 1 in the halves
        const uint32_t bits = (spread & 0x00800080u) << 8 | (spread & 0x007F007Fu) << 4;
        pairs[i] = bf16_pair_bits(__hmul2(bf16_pair(bits), unbias));
    }
    return make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
}

struct Fp8Weights {
    using Element = __nv_fp8_e4m3;
    using Loaded = uint2;
    static constexpr bool SCALED = true;
    static __device__ __forceinline__ uint2 load(const __nv_fp8_e4m3* base, int row, int rows, int K, int k) {
        if (row >= rows) return make_uint2(0, 0);
        return *reinterpret_cast<const uint2*>(base + (size_t)row * K + k);
    }
    static __device__ __forceinline__ uint4 operand(const uint2& loaded) { return e4m3_bf16x8(loaded); }
};

// An element's sum with the bias of weight row `n` (none where `bias` is null) added in f32,
// rounded to bf16: every form's last operations on a plain element.
__device__ __forceinline__ __nv_bfloat16 finish(float sum, const __nv_bfloat16* bias, int n) {
    if (bias) sum += __bfloat162float(bias[n]);
    return __float2bfloat16_rn(sum);
}

// SwiGLU's gating of column n from the sums of gate row n and up row half + n, each finished
// as a plain element: every SwiGLU form's last operations.
__device__ __forceinline__ __nv_bfloat16 gated(float gate, float up, const __nv_bfloat16* bias, int n, int half) {
    return __float2bfloat16_rn(
        silu_times(__bfloat162float(finish(gate, bias, n)), __bfloat162float(finish(up, bias, half + n))));
}

// Where a lane's rows of x lie, as `mma_partials` reads them (`load`: 16 bytes of the lane's
// row g of group r from element k, zeros past the rows). Consecutive rows of x [M, K]: the
// lane's of group r is row first + 8 r.
struct ConsecutiveRows {
    const __nv_bfloat16* x;
    int first, M, K;
    __device__ __forceinline__ uint4 load(int r, int k) const {
        const int row = first + 8 * r;
        if (row >= M) return make_uint4(0, 0, 0, 0);
        return *reinterpret_cast<const uint4*>(x + (size_t)row * K + k);
    }
};

// Listed rows of x [*, K]: the lane's of group r is row[r], -1 past the rows.
template <int G>
struct ListedRows {
    const __nv_bfloat16* x;
    int row[G];
    int K;
    __device__ __forceinline__ uint4 load(int r, int k) const {
        if (row[r] < 0) return make_uint4(0, 0, 0, 0);
        return *reinterpret_cast<const uint4*>(x + (size_t)row[r] * K + k);
    }
};

// The partial sums of a block of MMA_WARPS warps over F tiles of 16 weight rows and G groups
// of 8 rows of x (`xs`, above), written to `partial` [warp][row of the groups][column of the
// tiles] (shared; a row padded by one so that the lanes writing their fragments spread over
// the banks), which every thread may read after the call. Tile f's rows start at weight row
// tile_row[f], and rows from tile_end[f] on read as zeros. DEPTH steps of loads in flight a
// warp. Scaled weights take their block_n x block_k blocks' `scales`, for a weight of N rows.
template <typename W, int F, int G, int DEPTH, typename X>
__device__ void mma_partials(float (*partial)[G * 8][F * 16 + 1], const typename W::Element* w,
                             const int (&tile_row)[F], const int (&tile_end)[F], const X& xs, int N, int K,
                             const float* scales, int block_n, int block_k) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    float d[F][G][4];
#pragma unroll
    for (int f = 0; f < F; ++f)
#pragma unroll
        for (int r = 0; r < G; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) d[f][r][i] = 0.f;
    // A warp's steps come DEPTH at a time, every load of the group issued before its first
    // mma, so that a warp has DEPTH steps of loads in flight; their mma instructions then run in
    // step order. A step's first element is the same for the whole warp, so every lane runs
    // every mma, and a step past K runs none.
    // Scaled weights: where weight row n's scales start (clamped for rows past N, whose
    // weights load as zeros).
    const int k_blocks = W::SCALED ? (K + block_k - 1) / block_k : 0;
    auto scale_row = [&](int n) { return scales + (size_t)(min(n, N - 1) / block_n) * k_blocks; };
    for (int first = warp * MMA_STEP; first < K; first += DEPTH * MMA_WARPS * MMA_STEP) {
        typename W::Loaded a[DEPTH][F][2];
        uint4 b[DEPTH][G];
        float scale[DEPTH][F][2];
#pragma unroll
        for (int s = 0; s < DEPTH; ++s) {
            const int k = first + s * MMA_WARPS * MMA_STEP + 8 * t;
            const bool in_k = k - 8 * t < K;
#pragma unroll
            for (int f = 0; f < F; ++f) {
                a[s][f][0] = W::load(w, tile_row[f] + g, in_k ? tile_end[f] : 0, K, k);
                a[s][f][1] = W::load(w, tile_row[f] + g + 8, in_k ? tile_end[f] : 0, K, k);
                if constexpr (W::SCALED) {
                    const int block = in_k ? (k - 8 * t) / block_k : 0;
                    scale[s][f][0] = scale_row(tile_row[f] + g)[block];
                    scale[s][f][1] = scale_row(tile_row[f] + g + 8)[block];
                }
            }
#pragma unroll
            for (int r = 0; r < G; ++r) b[s][r] = in_k ? xs.load(r, k) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int s = 0; s < DEPTH; ++s) {
            if (first + s * MMA_WARPS * MMA_STEP >= K) break;
#pragma unroll
            for (int f = 0; f < F; ++f) {
                const uint4 lo = W::operand(a[s][f][0]), hi = W::operand(a[s][f][1]);
#pragma unroll
                for (int r = 0; r < G; ++r) {
                    if constexpr (W::SCALED) {
                        // Elements 0, 1: weight row g; 2, 3: row g + 8 (mma.cuh).
                        float step[4] = {0.f, 0.f, 0.f, 0.f};
                        mma_step(step, lo, hi, b[s][r]);
#pragma unroll
                        for (int i = 0; i < 4; ++i) d[f][r][i] = fmaf(scale[s][f][i >> 1], step[i], d[f][r][i]);
                    } else {
                        mma_step(d[f][r], lo, hi, b[s][r]);
                    }
                }
            }
        }
    }

    // Accumulator element i of lane (g, t): weight row g (+ 8 for i >= 2) of the tile, row
    // 2t (+ 1 for odd i) of the group.
#pragma unroll
    for (int f = 0; f < F; ++f)
#pragma unroll
        for (int r = 0; r < G; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) partial[warp][8 * r + 2 * t + (i & 1)][16 * f + g + 8 * (i >> 1)] = d[f][r][i];
    __syncthreads();
}

// Element (row, col) of a block's sums: its warps' partial sums (`mma_partials`) in warp order.
template <int R, int C>
__device__ __forceinline__ float block_sum(float (*partial)[R][C], int row, int col) {
    float total = partial[0][row][col];
#pragma unroll
    for (int v = 1; v < MMA_WARPS; ++v) total += partial[v][row][col];
    return total;
}

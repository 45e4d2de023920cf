// The projections of a mixture-of-experts block whose experts' weights are dense, bf16 or
// block-scaled FP8 (Qwen3-MoE and its FP8 checkpoints; gpt-oss from a dense checkpoint), on the
// tensor cores, bf16 rows. kernels/moe.cu's routing, grouping and combine serve them unchanged,
// and they take its tiles of pairs of one expert as the MXFP4 projections do:
//   moe_dense_gate_up_W[_wide]  per tile, the gate and up projections of the pairs' rows of
//                               x, then the (clamped) SwiGLU of each gate and up element,
//                               rounded to bf16: activations [pairs, I] bf16;
//   moe_dense_down_W[_wide]     per tile, the down projection of the pairs' activations,
//                               widened to f32: [pairs, H] f32, as moe_combine and the next
//                               block's norm read an expert's output;
// W the weights' type, bf16 or f8e4m3.
// Each projection element is a linear layer's on the tensor cores (kernels/linear_mma.cuh:
// `mma_partials`, then `block_sum` and `finish`: its bias added, rounded to bf16), so an
// expert computes what the CPU's does, its projections through linear layers and its
// SwiGLU over their bf16 outputs, up to the order of the sums. That order depends on the inner
// dimension alone, so a pair's result is the same whatever other pairs, rows or experts share
// the launch, and in the narrow forms (tiles of MOE_TILE pairs) and the wide ones
// (MOE_WIDE_TILE) alike.
//
// Expert e's weights, all experts' end to end: gate_up [E, 2I, H] (its I gate rows, then its I
// up rows) with a bias [E, 2I], down [E, H, I] with a bias [E, H]; a null bias is none. FP8
// weights have scales, one f32 a block_n x block_k block (kernels/linear.cu's layout), each
// expert's starting on a row of blocks: 2I and H are whole blocks of rows, block_k a multiple
// of 32. H and I are multiples of 32, and rows of x 16-byte aligned (the launcher checks).
#include "linear_mma.cuh"
#include "moe.cuh"

#if MOE_TILE != 8 || MOE_WIDE_TILE != 32
#error "a narrow tile is one group of 8 rows of x, a wide tile four"
#endif

// Where expert `expert`'s scales start, of a weight of `rows` rows an expert and `cols`
// columns; null for unscaled weights.
__device__ __forceinline__ const float* expert_scales(const float* scales, int expert, int rows, int cols,
                                                      int block_n, int block_k) {
    if (!scales) return nullptr;
    return scales + (size_t)expert * (rows / block_n) * ((cols + block_k - 1) / block_k);
}

// Activations for 16 columns c0 .. c0 + 16 and a tile of up to 8 G pairs a block: gate rows
// c0 .. and up rows I + c0 .. of the tile's expert, against the pairs' rows of x.
template <typename W, int G, int DEPTH>
__device__ void dense_gate_up(__nv_bfloat16* act, const __nv_bfloat16* x, const int* pair_rows,
                              const typename W::Element* w, const __nv_bfloat16* bias, const float* scales,
                              int block_n, int block_k, const int* tiles, const int* num_tiles, int hidden, int inter,
                              float alpha, float limit) {
    __shared__ float partial[MMA_WARPS][G * 8][2 * 16 + 1];
    Tile t;
    if (!tile_of(tiles, num_tiles, &t)) return;
    const int g = threadIdx.x % 32 / 4, c0 = blockIdx.x * 16;
    const int tile_row[2] = {c0, inter + c0}, tile_end[2] = {inter, 2 * inter};
    ListedRows<G> xs{x, {}, hidden};
#pragma unroll
    for (int r = 0; r < G; ++r) xs.row[r] = 8 * r + g < t.count ? pair_rows[t.first + 8 * r + g] : -1;
    const __nv_bfloat16* expert_bias = bias ? bias + (size_t)t.expert * 2 * inter : nullptr;
    mma_partials<W, 2, G, DEPTH>(partial, w + (size_t)t.expert * 2 * inter * hidden, tile_row, tile_end, xs,
                                 2 * inter, hidden, expert_scales(scales, t.expert, 2 * inter, hidden, block_n, block_k),
                                 block_n, block_k);
    for (int e = threadIdx.x; e < G * 8 * 16; e += blockDim.x) {
        const int pair = e / 16, col = e % 16, c = c0 + col;
        if (pair >= t.count || c >= inter) continue;
        const float gate = __bfloat162float(finish(block_sum(partial, pair, col), expert_bias, c));
        const float up = __bfloat162float(finish(block_sum(partial, pair, 16 + col), expert_bias, inter + c));
        act[(size_t)(t.first + pair) * inter + c] = __float2bfloat16_rn(swiglu_out(gate, up, alpha, limit));
    }
}

// Outputs for 16 F columns c0 .. and a tile of up to 8 G pairs a block: down rows c0 .. of the
// tile's expert, against the pairs' activations.
template <typename W, int F, int G, int DEPTH>
__device__ void dense_down(float* y, const __nv_bfloat16* act, const typename W::Element* w,
                           const __nv_bfloat16* bias, const float* scales, int block_n, int block_k, const int* tiles,
                           const int* num_tiles, int hidden, int inter) {
    __shared__ float partial[MMA_WARPS][G * 8][F * 16 + 1];
    Tile t;
    if (!tile_of(tiles, num_tiles, &t)) return;
    const int g = threadIdx.x % 32 / 4, c0 = blockIdx.x * F * 16;
    int tile_row[F], tile_end[F];
#pragma unroll
    for (int f = 0; f < F; ++f) {
        tile_row[f] = c0 + 16 * f;
        tile_end[f] = hidden;
    }
    const ConsecutiveRows xs{act, t.first + g, t.first + t.count, inter};
    const __nv_bfloat16* expert_bias = bias ? bias + (size_t)t.expert * hidden : nullptr;
    mma_partials<W, F, G, DEPTH>(partial, w + (size_t)t.expert * hidden * inter, tile_row, tile_end, xs, hidden,
                                 inter, expert_scales(scales, t.expert, hidden, inter, block_n, block_k), block_n,
                                 block_k);
    for (int e = threadIdx.x; e < G * 8 * F * 16; e += blockDim.x) {
        const int pair = e / (F * 16), col = e % (F * 16), c = c0 + col;
        if (pair >= t.count || c >= hidden) continue;
        y[(size_t)(t.first + pair) * hidden + c] = __bfloat162float(finish(block_sum(partial, pair, col), expert_bias, c));
    }
}

#define MOE_DENSE_GATE_UP(NAME, W, G, DEPTH)                                                    \
    extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS)                               \
        NAME(__nv_bfloat16* act, const __nv_bfloat16* x, const int* pair_rows, const W::Element* w, \
             const __nv_bfloat16* bias, const float* scales, int block_n, int block_k, const int* tiles, \
             const int* num_tiles, int hidden, int inter, float alpha, float limit) {            \
        dense_gate_up<W, G, DEPTH>(act, x, pair_rows, w, bias, scales, block_n, block_k, tiles, num_tiles, hidden, \
                                   inter, alpha, limit);                                         \
    }
#define MOE_DENSE_DOWN(NAME, W, F, G, DEPTH)                                                    \
    extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS)                               \
        NAME(float* y, const __nv_bfloat16* act, const W::Element* w, const __nv_bfloat16* bias, \
             const float* scales, int block_n, int block_k, const int* tiles, const int* num_tiles, int hidden, \
             int inter) {                                                                       \
        dense_down<W, F, G, DEPTH>(y, act, w, bias, scales, block_n, block_k, tiles, num_tiles, hidden, inter); \
    }

// The shapes of linear_mma.cu's forms: narrow ones for decode steps' few pairs an expert, wide
// ones where the average expert has more than a narrow tile.
MOE_DENSE_GATE_UP(moe_dense_gate_up_bf16, Bf16Weights, 1, 2)
MOE_DENSE_GATE_UP(moe_dense_gate_up_bf16_wide, Bf16Weights, 4, 1)
MOE_DENSE_DOWN(moe_dense_down_bf16, Bf16Weights, 1, 1, 4)
MOE_DENSE_DOWN(moe_dense_down_bf16_wide, Bf16Weights, 2, 4, 1)
MOE_DENSE_GATE_UP(moe_dense_gate_up_f8e4m3, Fp8Weights, 1, 2)
MOE_DENSE_GATE_UP(moe_dense_gate_up_f8e4m3_wide, Fp8Weights, 4, 1)
MOE_DENSE_DOWN(moe_dense_down_f8e4m3, Fp8Weights, 1, 1, 4)
MOE_DENSE_DOWN(moe_dense_down_f8e4m3_wide, Fp8Weights, 2, 4, 1)

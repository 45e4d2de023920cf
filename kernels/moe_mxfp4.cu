// gpt-oss's MXFP4 expert projections on the CUDA cores (PEAGLE_CUDA_MATMUL=fma), over the
// tiles of pairs that moe.cu's routing lists, and `moe_lay_out`, which puts the checkpoint's
// weights in the device's order (mxfp4.cuh) once, on upload.
//   moe_gate_up  per tile, the gate and up projections with their biases and the (clamped)
//                SwiGLU: activations [pairs, I] in f32;
//   moe_down     per tile, the down projection with its bias: [pairs, H] in f32.
//
// Batch invariance: one warp computes one output column for the pairs of its tile; lane l sums
// MXFP4 blocks l, l + 32, ... of the inner dimension in order, 32 products each (their inputs
// read 8 at a time by vector loads: rows start 16-byte aligned), then the warp reduces by a
// fixed butterfly. The order depends on the inner dimension alone, so a pair's
// result is the same whatever other pairs, rows or experts share the launch.
#include "common.cuh"
#include "moe.cuh"
#include "mxfp4.cuh"

#define MOE_WARPS 4

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

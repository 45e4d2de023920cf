// What the projections of a mixture-of-experts block share, whatever their weights' format
// (moe_mxfp4.cu's and moe_mxfp4_mma.cu's MXFP4 ones, moe_dense.cu's bf16 or FP8 ones): the
// tiles of pairs of one expert that moe.cu's routing lists, and the experts' gating.
#pragma once
#include "common.cuh"

// Pairs a tile holds: the narrow projections' tiles, and the wide tensor-core ones'.
#define MOE_TILE 8
#define MOE_WIDE_TILE 32

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

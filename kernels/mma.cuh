// The tensor-core instruction peagle's mma kernels share (sm_80 and newer), and the layout of
// its operands in registers (PTX ISA, mma.m16n8k16): lane (g, t), g = lane / 4 and t = lane % 4,
// holds a's rows g and g + 8 at inner positions 2t, 2t + 1, 2t + 8 and 2t + 9, b's column g at
// the same inner positions, and d's rows g and g + 8 at columns 2t and 2t + 1 (d[0], d[1]: row
// g; d[2], d[3]: row g + 8). A register's low half is the lower position. The kernels' use of
// it is simulated, without a GPU, by scripts/mma_layout_test.py, and the CUDA emulator
// (cuda-emulator/) runs the instruction by the same layout: change them together.
#pragma once
#include <stdint.h>

// d += a b for one m16n8k16 tile: a the 16 x 16 weight tile (rows: output columns), b the
// 16 x 8 tile of x (columns: rows of x), d the 16 x 8 accumulator.
__device__ __forceinline__ void mma_bf16(float* d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#ifdef PEAGLE_CUDA_EMULATION
    const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
    emu::mma_m16n8k16_bf16(d, a, b);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// d += one step of 32 of the inner dimension, as two mma: `lo` and `hi` hold a lane's 8
// elements of the step from weight rows g and g + 8 of the tile, `x8` its 8 from column g of
// x; elements 0..4 of each are the first mma's inner positions 2t, 2t + 1, 2t + 8, 2t + 9,
// elements 4..8 the second's (the same permutation for both operands).
__device__ __forceinline__ void mma_step(float* d, const uint4& lo, const uint4& hi, const uint4& x8) {
    mma_bf16(d, lo.x, hi.x, lo.y, hi.y, x8.x, x8.y);
    mma_bf16(d, lo.z, hi.z, lo.w, hi.w, x8.z, x8.w);
}

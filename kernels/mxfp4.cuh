// gpt-oss's MXFP4 expert weights on the device: the order they are kept in and their
// dequantization in registers, for the projections of moe_mxfp4.cu and moe_mxfp4_mma.cu.
//
// Per expert as loaded: `blocks` [out, in / 32, 16] bytes, two e2m1 values a byte (low nibble
// first), and `scales` [out, in / 32], each scaling 32 values by 2^(e - 127); gate_up's rows
// are the I gate rows, then the I up rows.
#pragma once
#include "common.cuh"

// Each expert's weight [rows, groups] (its blocks and its scales alike) is kept in tiles of
// MOE_LAYOUT_ROWS rows, tile after tile; a tile's blocks in quads of MOE_LAYOUT_QUAD
// consecutive blocks of a row, quad after quad, and a quad's rows in order. The tensor-core
// kernels read a quad of 8 rows a warp load, 16 bytes a lane (a whole block), so that load
// reads 512 contiguous bytes and the blocks' scales 32, where the checkpoint's order would
// scatter both over 8 rows. A row's last quad (and an expert's last tile) may be shorter:
// `block_index` is where block `group` of row `row` lies, counted in blocks from the expert's
// first. Every expert's weight has rows * groups blocks, as loaded. Within each 4-byte word of
// a block, each code's bits are moved too (`MOE_CODE_BITS`, for `dequantize8_bf16`).
// `moe_lay_out` (moe_mxfp4.cu) puts the checkpoint's weights in this order once, on upload.
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

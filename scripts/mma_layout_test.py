"""The tensor-core kernels' operand layout, checked without a GPU: each lane's loads as
kernels/linear_mma.cu and kernels/moe_mxfp4_mma.cu index them, placed where the PTX ISA
puts an m16n8k16 mma's fragments (kernels/mma.cuh), multiplied, and the accumulators written
back as the kernels index them, must give the plain product. Integer operands keep every sum
exact, so the check is equality. Also mxfp4.cuh's places for the bits of MXFP4 codes against the
rotations that read them. Run by scripts/test.sh; plain Python.

Change this file with the kernels' indexing, or it proves nothing about them."""

import os
import random
import re

WARPS = 8  # a block's warps, MMA_WARPS and MOE_MMA_WARPS
STEP = 32  # the inner dimension of one mma_step: two mma of 16
QUAD = 4  # MXFP4 blocks in mxfp4.cuh's quads (MOE_LAYOUT_QUAD), 128 elements
LAYOUT_ROWS = 16  # rows in a tile of mxfp4.cuh's device layout (MOE_LAYOUT_ROWS)


def mma(d, a_regs, b_regs):
    """One m16n8k16 mma over 32 lanes: a_regs[lane] = four pairs (registers a0..a3), b_regs[lane]
    two pairs (b0, b1), d[lane] four accumulators, in the PTX ISA's fragment layout."""
    a = [[0] * 16 for _ in range(16)]
    b = [[0] * 8 for _ in range(16)]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        (a0, a1, a2, a3), (b0, b1) = a_regs[lane], b_regs[lane]
        for j in range(2):
            a[g][2 * t + j], a[g + 8][2 * t + j] = a0[j], a1[j]
            a[g][2 * t + 8 + j], a[g + 8][2 * t + 8 + j] = a2[j], a3[j]
            b[2 * t + j][g], b[2 * t + 8 + j][g] = b0[j], b1[j]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):
            row, col = g + 8 * (i >> 1), 2 * t + (i & 1)
            d[lane][i] += sum(a[row][k] * b[k][col] for k in range(16))


def pairs(eight):
    """Eight consecutive elements as a 16-byte load's four registers (.x .y .z .w)."""
    return [eight[0:2], eight[2:4], eight[4:6], eight[6:8]]


def linear_steps(warp, inner):
    """linear_mma.cu's mma_steps of a warp, in order: for each, the element a lane's 8 start at
    (8t into steps of 32 dealt to the warps in turn)."""
    return [lambda lane, step=step: step + 8 * (lane % 4) for step in range(warp * STEP, inner, WARPS * STEP)]


def moe_steps(warp, inner):
    """moe_mxfp4_mma.cu's mma_steps of a warp: its quads of 128 (dealt to the warps in turn), each four
    mma_steps j, lane t's elements 8j .. 8j + 8 of block t of the quad."""
    quads = range(warp, (inner + QUAD * STEP - 1) // (QUAD * STEP), WARPS)
    return [lambda lane, q=q, j=j: QUAD * STEP * q + STEP * (lane % 4) + 8 * j for q in quads for j in range(4)]


def tile_product(w_rows, x_rows, inner, steps):
    """Every warp's accumulators for one tile of 16 weight rows by 8 rows of x, summed in warp
    order, as the kernels compute them: [x row][weight row]. w_rows(lane, k) and x_rows(lane, k)
    are the 8 elements a lane reads from element k (its weight rows g and g + 8; its x row g),
    zeros from the inner dimension's end; steps(warp, inner) the warp's mma_steps."""
    sums = [[0] * 16 for _ in range(8)]
    for warp in range(WARPS):
        d = [[0] * 4 for _ in range(32)]
        for step in steps(warp, inner):
            lanes = []
            for lane in range(32):
                lo, hi = w_rows(lane, step(lane))
                lanes.append((pairs(lo), pairs(hi), pairs(x_rows(lane, step(lane)))))
            # Elements 8t .. 8t + 4 feed the first mma, 8t + 4 .. 8t + 8 the second.
            mma(d, [(lo[0], hi[0], lo[1], hi[1]) for lo, hi, _ in lanes], [(x[0], x[1]) for _, _, x in lanes])
            mma(d, [(lo[2], hi[2], lo[3], hi[3]) for lo, hi, _ in lanes], [(x[2], x[3]) for _, _, x in lanes])
        for lane in range(32):
            g, t = lane // 4, lane % 4
            for i in range(4):
                sums[2 * t + (i & 1)][g + 8 * (i >> 1)] += d[lane][i]
    return sums


def check_linear(m, n, k):
    """linear_mma.cu: out [m, n] = x [m, k] w [n, k]^T, block by block (16 columns, 8 rows a
    tile; the wide form's tiles are these side by side)."""
    w = [[random.randint(-3, 3) for _ in range(k)] for _ in range(n)]
    x = [[random.randint(-3, 3) for _ in range(k)] for _ in range(m)]
    zeros = [0] * 8
    for n0 in range(0, n, 16):
        for m0 in range(0, m, 8):
            def w_rows(lane, at):
                g = lane // 4
                return [w[r][at:at + 8] if r < n else zeros for r in (n0 + g, n0 + g + 8)]

            def x_rows(lane, at):
                r = m0 + lane // 4
                return x[r][at:at + 8] if r < m else zeros

            sums = tile_product(w_rows, x_rows, k, linear_steps)
            for row in range(8):
                for col in range(16):
                    if m0 + row < m and n0 + col < n:
                        want = sum(a * b for a, b in zip(x[m0 + row], w[n0 + col]))
                        assert sums[row][col] == want, (m, n, k, m0 + row, n0 + col)


E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


def block_index(rows, groups, row, group):
    """mxfp4.cuh's block_index: where block `group` of row `row` of an
    expert's weight [rows, groups] lies in the device's layout, in blocks."""
    tile, in_tile = divmod(row, LAYOUT_ROWS)
    tile_rows = min(LAYOUT_ROWS, rows - tile * LAYOUT_ROWS)
    quad, in_quad = divmod(group, QUAD)
    quad_blocks = min(QUAD, groups - quad * QUAD)
    return tile * LAYOUT_ROWS * groups + quad * QUAD * tile_rows + in_tile * quad_blocks + in_quad


def kernel_block(rows, groups, row, group):
    """moe_mxfp4_mma.cu's lane_row and quad_part: where the mma kernels read block `group` of row `row`,
    from the row's first quad as if whole, a quad's stride and a short last quad's shift."""
    tile, in_tile = divmod(row, LAYOUT_ROWS)
    tile_rows = min(LAYOUT_ROWS, rows - tile * LAYOUT_ROWS)
    first = tile * LAYOUT_ROWS * groups + in_tile * QUAD + group % QUAD
    quads, quad = (groups + QUAD - 1) // QUAD, group // QUAD
    last_quad_blocks = groups - (groups - 1) // QUAD * QUAD
    return first + quad * QUAD * tile_rows + (in_tile * (last_quad_blocks - QUAD) if quad == quads - 1 else 0)


def check_moe(count, rows, inner, c0):
    """moe_mxfp4_mma.cu's kernels: a tile's `count` pairs against weight rows c0 .. c0 + 16 of `rows`,
    MXFP4 blocks of 32 (low nibble first) in the device's layout, a lane reading a whole block
    and each mma_step one of its 4-byte words, bytes 4j .. 4j + 4 being the block's elements
    8j .. 8j + 8; the tile's pairs eight at a time (the wide kernels' tiles of up to 32 are
    eights side by side). The weights are placed by block_index (moe_lay_out's) and read where
    the kernels look for them (kernel_block). A word's codes are read here as nibbles in order;
    the device also moves each code's bits within its word, which check_code_bits checks."""
    groups = inner // 32
    codes = [[random.randrange(16) for _ in range(inner)] for _ in range(rows)]
    scale = [[random.choice([126, 127, 128]) for _ in range(groups)] for _ in range(rows)]
    device = bytearray(rows * groups * 16)
    device_scales = bytearray(rows * groups)
    for r in range(rows):
        for b in range(groups):
            at = block_index(rows, groups, r, b)
            device[16 * at:16 * at + 16] = bytes(codes[r][i] | codes[r][i + 1] << 4 for i in range(32 * b, 32 * b + 32, 2))
            device_scales[at] = scale[r][b]
    assert sorted(block_index(rows, groups, r, b) for r in range(rows) for b in range(groups)) == list(range(rows * groups))
    dense = [[E2M1[c] * 2.0 ** (scale[r][j // 32] - 127) for j, c in enumerate(codes[r])] for r in range(rows)]
    x = [[random.randint(-3, 3) for _ in range(inner)] for _ in range(count)]

    def dequantize8(r, at):
        block, j = at // 32, at % 32 // 8
        where = kernel_block(rows, groups, r, block)
        word = int.from_bytes(device[16 * where + 4 * j:16 * where + 4 * j + 4], "little")
        return [E2M1[word >> 4 * i & 15] * 2.0 ** (device_scales[where] - 127) for i in range(8)]

    def w_rows(lane, at):
        g = lane // 4
        return [dequantize8(r, at) if r < rows and at < inner else [0] * 8 for r in (c0 + g, c0 + g + 8)]

    for eight in range(0, count, 8):
        def x_rows(lane, at):
            pair = eight + lane // 4
            return x[pair][at:at + 8] if pair < count and at < inner else [0] * 8

        sums = tile_product(w_rows, x_rows, inner, moe_steps)
        for pair in range(eight, min(count, eight + 8)):
            for col in range(16):
                if c0 + col < rows:
                    want = sum(a * b for a, b in zip(x[pair], dense[c0 + col]))
                    assert sums[pair - eight][col] == want, (count, rows, inner, pair, col)


def code_bits():
    """mxfp4.cuh's MOE_CODE_BITS: [code k][bit b] = its place in the device's word."""
    source = open(os.path.join(os.path.dirname(__file__), "..", "kernels", "mxfp4.cuh")).read()
    table = re.search(r"#define MOE_CODE_BITS((?:[^\n]*\\\n)*[^\n]*)", source).group(1)
    rows = [[int(v) for v in row.split(",")] for row in re.findall(r"\{([^}]*)\}", table)]
    assert len(rows) == 8 and all(len(r) == 4 for r in rows), rows
    return rows


def rotl(w, n):
    return (w << n | w >> (32 - n)) & 0xFFFFFFFF if n else w


def check_code_bits():
    """moe_lay_out's move of each code's bits (device_word, by MOE_CODE_BITS as mxfp4.cuh has it)
    and dequantize8_bf16's rotations and masks (restated here: change them together): pair i of
    the device's word must be codes 2i and 2i + 1 of the checkpoint's, each as a bf16 half of
    its magnitude (e1 e0 m) at bits 8..6 and its sign at 15, for every value of every byte; and
    every bit must have a place of its own. The values' scaling is the GPU tests' to check."""
    places = code_bits()
    assert sorted(p for row in places for p in row) == list(range(32)), places
    pair = 0x81C081C0

    def device_word(w):
        return sum((w >> (4 * k + b) & 1) << places[k][b] for k in range(8) for b in range(4))

    def pairs(w):
        return [w & pair, rotl(w, 4) & pair, rotl(w, 10) & pair,
                (rotl(w, 6) & 0x80C080C0) | (rotl(w, 30) & 0x01000100)]

    def half(code):
        return (code & 7) << 6 | (code >> 3) << 15

    for j in range(4):
        for value in range(256):
            got = pairs(device_word(value << 8 * j))
            want = [half(value & 15) | half(value >> 4) << 16 if i == j else 0 for i in range(4)]
            assert got == want, (j, value, [hex(v) for v in got], [hex(v) for v in want])


def main():
    random.seed(7)
    for m, n, k in [(1, 20, 64), (3, 17, 96), (9, 33, 320), (8, 16, 32)]:
        check_linear(m, n, k)
    for count, rows, inner, c0 in [(3, 96, 64, 80), (8, 48, 320, 32), (1, 40, 96, 32), (27, 48, 64, 16),
                                   (2, 37, 1440, 16), (5, 20, 2880, 0), (4, 37, 160, 32)]:
        check_moe(count, rows, inner, c0)
    check_code_bits()
    print("mma_layout_test.py: ok")


if __name__ == "__main__":
    main()

// Batch-invariant matrix product on tensor cores: out [M, N] = x [M, K] times w [N, K]
// transposed, bf16 in and out, f32 accumulation (mma.sync m16n8k16, sm_80 and newer).
//
// Every output element is the same chain of operations whatever M is: the K dimension is cut
// into steps of 32, step s going to warp s % MMA_WARPS of the block; a warp accumulates its
// steps in order into a tensor-core accumulator, two mma instructions a step; then the
// block sums its warps' partial sums in warp order. The order depends on K alone, and an mma
// computes each element of its output from that element's own row, column and accumulator,
// so a row gives the same bits alone, in a verification window or among 2,048 prefill rows.
// The kernels differ only in how much of the output a block covers, so a launcher may pick
// any for any M without changing a bit:
// - linear_mma_bf16: 16 output columns and 8 rows of x a block, for a few rows (decode steps,
//   verification windows): the most blocks, and so the most weight loads in flight;
// - linear_mma_bf16_wide: 32 columns and 32 rows a block, where many rows share each weight;
// - linear_mma_bf16_staged: 64 columns and 64 rows a block, for many rows (prefill chunks,
//   wide verification batches): its warps share each step's operands through shared memory,
//   so a block reads a weight tile once for 64 rows (below, "The staged form").
// Their `_swiglu` forms take a fused gate/up projection (w's first N / 2 rows the gate's, the
// rest the up's) and write SwiGLU's gating of it, [M, N / 2]: a block covers 16 gate columns
// and the 16 up columns that pair with them, sums each element as the plain kernels do, rounds
// it to bf16, and gates the pair as kernels/swiglu.cu does (`silu_times`): the bits of the
// plain kernel followed by swiglu.cu, in one launch and with no [M, N] tensor between.
//
// A step of 32 is laid out so that a lane's loads are 16 contiguous bytes: lane (g, t) (g =
// lane / 4, t = lane % 4) reads elements 8t .. 8t + 8 of the step from weight rows g and g + 8
// of a 16-column tile and from row g of an 8-row group of x. Elements 8t + 0..4 are the first
// mma's inner positions 2t, 2t + 1, 2t + 8, 2t + 9, elements 8t + 4..8 the second's: a
// permutation of the inner dimension, the same for both operands, so each mma multiplies
// matching elements. A bias (`bias` [N]; null for none) is added to each element's sum in f32
// before its rounding. Requires K % 32 == 0 and 16-byte aligned rows (the launcher checks).
//
// Block-scaled FP8 weights (e4m3, one f32 scale per block_n x block_k block, block_k a
// multiple of 32; kernels/linear.cu has the layout) take the narrow and wide forms,
// `linear_mma_bf16_f8e4m3[_wide]`: a lane loads its 8 weights of a step as 8 bytes and widens
// them to bf16 exactly (`e4m3_bf16x8`), and each step's two mma go into an accumulator of
// their own, which is then scaled by the step's weight rows' scales and added to the sum in
// f32 (a step lies in one block). The chain still depends on K alone. No staged form: from 64
// rows the wide one serves, at about the staged one's time for bf16.
#include "linear_mma.cuh"

// F tiles of 16 weight rows and G groups of 8 rows of x a block; DEPTH steps of loads in
// flight a warp. A plain block's tiles are F consecutive ones, 16 F output columns; a SwiGLU
// block's (F = 2) are 16 gate rows and the 16 up rows N / 2 further, 16 output columns.
template <typename W, int F, int G, int DEPTH, bool SWIGLU>
__device__ void linear_mma(__nv_bfloat16* out, const __nv_bfloat16* x, const typename W::Element* w,
                           const __nv_bfloat16* bias, int M, int N, int K, const float* scales, int block_n,
                           int block_k) {
    static_assert(!SWIGLU || F == 2, "a SwiGLU block is a gate tile and an up tile");
    static_assert(!(SWIGLU && W::SCALED), "scaled weights have no SwiGLU form");
    __shared__ float partial[MMA_WARPS][G * 8][F * 16 + 1];
    const int g = threadIdx.x % 32 / 4;
    const int half = N / 2, m0 = blockIdx.x * G * 8;
    const int n0 = blockIdx.y * (SWIGLU ? 16 : F * 16);
    // Tile f's first weight row, and the end of the rows it may read.
    int tile_row[F], tile_end[F];
#pragma unroll
    for (int f = 0; f < F; ++f) {
        tile_row[f] = SWIGLU ? n0 + f * half : n0 + 16 * f;
        tile_end[f] = SWIGLU ? (f + 1) * half : N;
    }
    const ConsecutiveRows xs{x, m0 + g, M, K};
    mma_partials<W, F, G, DEPTH>(partial, w, tile_row, tile_end, xs, N, K, scales, block_n, block_k);
    const int columns = SWIGLU ? 16 : F * 16, width = SWIGLU ? half : N;
    for (int e = threadIdx.x; e < G * 8 * columns; e += blockDim.x) {
        const int row = e / columns, col = e % columns, c = n0 + col;
        if (m0 + row >= M || c >= width) continue;
        __nv_bfloat16* o = out + (size_t)(m0 + row) * width + c;
        *o = SWIGLU ? gated(block_sum(partial, row, col), block_sum(partial, row, 16 + col), bias, c, half)
                    : finish(block_sum(partial, row, col), bias, c);
    }
}

#define LINEAR_MMA(NAME, F, G, DEPTH, SWIGLU)                                                  \
    extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS)                               \
        NAME(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, \
             int M, int N, int K) {                                                            \
        linear_mma<Bf16Weights, F, G, DEPTH, SWIGLU>(out, x, w, bias, M, N, K, nullptr, 1, 1); \
    }
// The FP8 forms take their scales as kernels/linear.cu's kernels do.
#define LINEAR_MMA_FP8(NAME, F, G, DEPTH)                                                      \
    extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS)                               \
        NAME(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_fp8_e4m3* w, const __nv_bfloat16* bias, \
             int M, int N, int K, const float* scales, int block_n, int block_k) {             \
        linear_mma<Fp8Weights, F, G, DEPTH, false>(out, x, w, bias, M, N, K, scales, block_n, block_k); \
    }

LINEAR_MMA(linear_mma_bf16, 1, 1, 4, false)
LINEAR_MMA(linear_mma_bf16_wide, 2, 4, 1, false)
// Two tiles of weight rows a step, so half the steps in flight: the same loads as the plain
// narrow kernel's, and its registers.
LINEAR_MMA(linear_mma_swiglu_bf16, 2, 1, 2, true)
LINEAR_MMA(linear_mma_swiglu_bf16_wide, 2, 4, 1, true)
LINEAR_MMA_FP8(linear_mma_bf16_f8e4m3, 1, 1, 4)
LINEAR_MMA_FP8(linear_mma_bf16_f8e4m3_wide, 2, 4, 1)

// ---- The staged form -----------------------------------------------------------------------------
//
// A block of 8 warps covers 64 weight rows (for SwiGLU, 32 gate rows and their 32 up rows) by
// 64 rows of x; warp (wn, wm) = (warp % 2, warp / 2) covers 32 weight rows (2 tiles of 16: a
// SwiGLU warp's gate tile and its up tile) by 16 rows of x (2 groups of 8). Every warp runs
// every step, from a copy of the step's operands the block stages in shared memory,
// double-buffered: a block reads its operands once a step, 64 rows of each, where in the forms
// above a step is one warp's alone, of at most 32 rows of each.
//
// The chain is theirs. There, warp v sums steps v, v + 8, v + 16, ... in order into an
// accumulator that starts at zero (its residue's sum), and the block adds the 8 residues' sums
// in order, the first one first. Here every warp walks the steps residue by residue (steps 0,
// 8, 16, ..., then 1, 9, 17, ..., then 2, ...) into one accumulator, zeroed at each residue's
// start, and adds each residue's sum to a second one, the first residue's taken as it is; a
// residue with no step (K < 256) adds its zero, as a warp with no step does there. So an
// element is the same mma and additions in the same order, and has the same bits.

#define STAGED_ROWS 64
#define STAGED_CHUNKS (MMA_STEP / 8)

// The step after step `s` of residue `r` in residue order (K / 32 steps): the next of the
// residue, else the first of the next residue, which is past the last step where K has
// fewer steps than there are residues.
__device__ __forceinline__ void next_step(int* r, int* s, int steps) {
    *s += MMA_WARPS;
    if (*s >= steps) *s = ++*r;
}

template <bool SWIGLU>
__device__ void linear_mma_staged(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w,
                                  const __nv_bfloat16* bias, int M, int N, int K) {
    // [buffer][row][16 bytes of the step]: a quarter warp's reads (rows g and g + 1, every t)
    // are 128 contiguous bytes, so they meet no bank conflict.
    __shared__ uint4 w_stage[2][STAGED_ROWS][STAGED_CHUNKS];
    __shared__ uint4 x_stage[2][STAGED_ROWS][STAGED_CHUNKS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int wn = warp % 2, wm = warp / 2;
    const int half = N / 2, steps = K / MMA_STEP;
    const int n0 = blockIdx.y * (SWIGLU ? STAGED_ROWS / 2 : STAGED_ROWS), m0 = blockIdx.x * STAGED_ROWS;

    // What this thread stages a step: 16 bytes of weight row `row` of the block's and of its
    // row of x; null for rows past the matrix, which stage zeros.
    const int row = threadIdx.x / STAGED_CHUNKS, chunk = threadIdx.x % STAGED_CHUNKS;
    const bool up = SWIGLU && row >= STAGED_ROWS / 2;
    const int n = up ? half + n0 + row - STAGED_ROWS / 2 : n0 + row;
    const __nv_bfloat16* w_src = n < (SWIGLU && !up ? half : N) ? w + (size_t)n * K + 8 * chunk : nullptr;
    const __nv_bfloat16* x_src = m0 + row < M ? x + (size_t)(m0 + row) * K + 8 * chunk : nullptr;
    auto fetch = [&](const __nv_bfloat16* src, int step) {
        return src ? *reinterpret_cast<const uint4*>(src + step * MMA_STEP) : make_uint4(0, 0, 0, 0);
    };
    // The warp's tiles' first rows among the block's weight rows.
    const int tile_row[2] = {SWIGLU ? 16 * wn : 32 * wn, SWIGLU ? STAGED_ROWS / 2 + 16 * wn : 32 * wn + 16};

    float acc[2][2][4], total[2][2][4];
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[f][r][i] = total[f][r][i] = 0.f;
    // A residue's sum into the total (the first residue's as it is, the rest added in order),
    // and the accumulator zeroed for the next.
    auto fold = [&](int residue) {
#pragma unroll
        for (int f = 0; f < 2; ++f)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    total[f][r][i] = residue == 0 ? acc[f][r][i] : total[f][r][i] + acc[f][r][i];
                    acc[f][r][i] = 0.f;
                }
    };

    int residue = 0, step = 0, buffer = 0;
    w_stage[0][row][chunk] = fetch(w_src, 0);
    x_stage[0][row][chunk] = fetch(x_src, 0);
    __syncthreads();
    for (;;) {
        int next_residue = residue, next = step;
        next_step(&next_residue, &next, steps);
        const bool more = next_residue < MMA_WARPS && next < steps;
        uint4 w_next = make_uint4(0, 0, 0, 0), x_next = make_uint4(0, 0, 0, 0);
        if (more) {
            w_next = fetch(w_src, next);
            x_next = fetch(x_src, next);
        }
        uint4 a[2][2], b[2];
#pragma unroll
        for (int f = 0; f < 2; ++f) {
            a[f][0] = w_stage[buffer][tile_row[f] + g][t];
            a[f][1] = w_stage[buffer][tile_row[f] + g + 8][t];
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) b[r] = x_stage[buffer][16 * wm + 8 * r + g][t];
#pragma unroll
        for (int f = 0; f < 2; ++f)
#pragma unroll
            for (int r = 0; r < 2; ++r) mma_step(acc[f][r], a[f][0], a[f][1], b[r]);
        if (next_residue != residue) fold(residue);
        if (!more) break;
        w_stage[buffer ^ 1][row][chunk] = w_next;
        x_stage[buffer ^ 1][row][chunk] = x_next;
        __syncthreads();
        residue = next_residue;
        step = next;
        buffer ^= 1;
    }
    // The residues K has no step for, each adding its zero.
    for (int r = min(steps, MMA_WARPS); r < MMA_WARPS; ++r) fold(r);

    // Accumulator element i of lane (g, t): weight row g (+ 8 for i >= 2) of the tile, row
    // 2t (+ 1 for odd i) of the group.
    const int width = SWIGLU ? half : N;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int m = m0 + 16 * wm + 8 * r + 2 * t + (i & 1);
            if (m >= M) continue;
            __nv_bfloat16* o = out + (size_t)m * width;
            if (SWIGLU) {
                const int c = n0 + 16 * wn + g + 8 * (i >> 1);
                if (c < half) o[c] = gated(total[0][r][i], total[1][r][i], bias, c, half);
            } else {
#pragma unroll
                for (int f = 0; f < 2; ++f) {
                    const int c = n0 + tile_row[f] + g + 8 * (i >> 1);
                    if (c < N) o[c] = finish(total[f][r][i], bias, c);
                }
            }
        }
}

#define LINEAR_MMA_STAGED(NAME, SWIGLU)                                                        \
    extern "C" __global__ void __launch_bounds__(32 * MMA_WARPS)                               \
        NAME(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, \
             int M, int N, int K) {                                                            \
        linear_mma_staged<SWIGLU>(out, x, w, bias, M, N, K);                                   \
    }

LINEAR_MMA_STAGED(linear_mma_bf16_staged, false)
LINEAR_MMA_STAGED(linear_mma_swiglu_bf16_staged, true)

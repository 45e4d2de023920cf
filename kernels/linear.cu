// Batch-invariant matrix product: out [M, N] = x [M, K] times w [N, K] transposed, f32
// accumulation.
//
// Every output element is the same chain: lane l of a warp sums the products of elements
// k = 8l + 256i + j (j = 0..7) in increasing order, then the lanes' sums meet in a fixed
// butterfly. That order depends on K alone, so an element's value is the same whether its row
// is computed alone or among 2,048 others: there is no M-dependent split of K. Three kernels
// share the chain and differ only in how warps split the work, so a launcher may pick any of
// them for any M without changing a bit; the block's warps take consecutive columns:
// - linear_*_row: one row of x and one output column a warp: the fewest registers, so the
//   most warps and weight loads in flight where a decode step reads every weight for one row;
// - linear_*: LINEAR_ROWS rows of x and one output column a warp, for a few rows (a
//   verification window);
// - linear_*_wide: LINEAR_ROWS rows and LINEAR_WIDE_COLUMNS columns a warp, so a row's values,
//   loaded once, serve every column of the warp: a quarter of the loads of x where many rows
//   share each column (verification windows of many sequences, prefill chunks).
// Requires K % 8 == 0 and 16-byte aligned rows (the launcher checks).
//
// A bias (`bias` [N] in the output's type; null for none) is added to each element's sum in
// f32, before the one rounding to the output's type.
//
// FP8 weights (e4m3) carry one f32 scale per block_n x block_k block (`scales`
// [ceil(N / block_n), ceil(K / block_k)], block_k a multiple of 8): each weight is widened and
// multiplied by its scale before its product, so the chain is the one of the dequantized f32
// weight. Other weights pass no scales.
#include "common.cuh"

#define LINEAR_ROWS 8
#define LINEAR_WARPS 8
#define LINEAR_WIDE_COLUMNS 4

// COLUMNS output columns of ROWS rows a warp. A column past N takes zeros, and its sums are
// never written. The loop over K is unrolled for one column a warp, whose loads are few (four
// times for one row, to keep more loads in flight; twice for more), and not for more columns,
// whose registers go to the sums. Unrolling moves loads, never the order of the sums.
template <typename T, typename W, int ROWS, int COLUMNS>
__device__ void linear(T* out, const T* x, const W* w, const T* bias, int M, int N, int K, const float* scales,
                       int block_n, int block_k) {
    static_assert(ROWS * COLUMNS <= 32, "a lane writes each of a warp's elements");
    const int lane = threadIdx.x % 32;
    const int n0 = (blockIdx.y * LINEAR_WARPS + threadIdx.x / 32) * COLUMNS;
    const int m0 = blockIdx.x * ROWS;
    if (n0 >= N) return;
    const int rows = min(ROWS, M - m0);
    const int cols = min(COLUMNS, N - n0);
    const T* x_rows = x + (size_t)m0 * K;
    const int k_blocks = (K + block_k - 1) / block_k;

    float acc[ROWS][COLUMNS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < COLUMNS; ++c) acc[r][c] = 0.f;
#pragma unroll(COLUMNS > 1 ? 1 : ROWS == 1 ? 4 : 2)
    for (int k = lane * 8; k < K; k += 256) {
        float wv[COLUMNS][8];
#pragma unroll
        for (int c = 0; c < COLUMNS; ++c) {
            if (c < cols) {
                load8(w + (size_t)(n0 + c) * K + k, wv[c]);
                if (scales) {
                    const float s = scales[(size_t)((n0 + c) / block_n) * k_blocks + k / block_k];
#pragma unroll
                    for (int j = 0; j < 8; ++j) wv[c][j] *= s;
                }
            } else {
#pragma unroll
                for (int j = 0; j < 8; ++j) wv[c][j] = 0.f;
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r < rows) {
                float xv[8];
                load8(x_rows + (size_t)r * K + k, xv);
#pragma unroll
                for (int c = 0; c < COLUMNS; ++c)
#pragma unroll
                    for (int j = 0; j < 8; ++j) acc[r][c] = fmaf(xv[j], wv[c][j], acc[r][c]);
            }
        }
    }
    // Every lane holds every sum after the butterflies; lane r * COLUMNS + c writes element
    // (r, c).
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < COLUMNS; ++c) {
            float sum = warp_sum(acc[r][c]);
            if (bias && c < cols) sum += to_f32(bias[n0 + c]);
            if (lane == r * COLUMNS + c && r < rows && c < cols) out[(size_t)(m0 + r) * N + n0 + c] = from_f32<T>(sum);
        }
}

#define LINEAR(NAME, T, W)                                                                     \
    extern "C" __global__ void __launch_bounds__(32 * LINEAR_WARPS)                            \
        NAME(T* out, const T* x, const W* w, const T* bias, int M, int N, int K, const float* scales, \
             int block_n, int block_k) {                                                       \
        linear<T, W, LINEAR_ROWS, 1>(out, x, w, bias, M, N, K, scales, block_n, block_k);      \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * LINEAR_WARPS)                            \
        NAME##_row(T* out, const T* x, const W* w, const T* bias, int M, int N, int K,          \
                   const float* scales, int block_n, int block_k) {                            \
        linear<T, W, 1, 1>(out, x, w, bias, M, N, K, scales, block_n, block_k);                \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(32 * LINEAR_WARPS)                            \
        NAME##_wide(T* out, const T* x, const W* w, const T* bias, int M, int N, int K,         \
                    const float* scales, int block_n, int block_k) {                           \
        linear<T, W, LINEAR_ROWS, LINEAR_WIDE_COLUMNS>(out, x, w, bias, M, N, K, scales, block_n, block_k); \
    }

LINEAR(linear_f32_f32, float, float)
LINEAR(linear_f32_bf16, float, __nv_bfloat16)
LINEAR(linear_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
LINEAR(linear_f32_f8e4m3, float, __nv_fp8_e4m3)
LINEAR(linear_bf16_f8e4m3, __nv_bfloat16, __nv_fp8_e4m3)

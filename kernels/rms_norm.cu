// RMSNorm of each row of x [rows, width] (or of a mixture of experts' output, combined as it is
// read: experts_add_rms_norm_*), optionally fused with the residual add before it:
// sum = x + residual (rounded to T), then out = weight * T(sum * rsqrt(mean(sum^2) + eps)),
// the rounding order of HF transformers. With a residual, `out` holds 2 * rows rows: the
// normed rows, then the sums. One block of RMS_THREADS per row.
//
// A row is read as vectors of 8 elements (the last one partial): thread i sums the squares of
// vectors i, i + RMS_THREADS, ... in order, then the block reduces by a fixed tree, so the
// order depends on the width alone. A decode step's row is one block's work, so a thread
// issues the loads of up to RMS_VECTORS vectors before it uses any, and keeps them for the
// output (`rms_norm`): the block waits on memory once, not once per element. Where the
// launcher says the rows allow it (`vector`: width % 8 == 0, every operand 16-byte aligned) a
// vector is one load; otherwise its elements are read one by one, to the same values.
#include "common.cuh"

#define RMS_THREADS 256
// Vectors of 8 a thread has in flight: one round of loads for rows up to 8192 wide.
#define RMS_VECTORS 4

// Vector `v` (elements 8v .. 8v + 8) of a row of `width` at p as f32, zeros past the row.
template <typename T>
__device__ __forceinline__ void load_vector(const T* p, int v, int width, int vector, float* out) {
    const int e = 8 * v;
    if (vector) {
        load8(p + e, out);
        return;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = e + i < width ? to_f32(p[e + i]) : 0.f;
}

// This thread's vectors of the round from `first` (first, first + RMS_THREADS, ...) of a row
// of `width` at p, as f32; as many as the row has.
template <typename T>
__device__ __forceinline__ void load_round(const T* p, int first, int width, int vector, float (*v)[8]) {
#pragma unroll
    for (int j = 0; j < RMS_VECTORS; ++j) {
        const int n = first + j * RMS_THREADS;
        if (8 * n >= width) break;
        load_vector(p, n, width, vector, v[j]);
    }
}

// The row added to the residual (or normed alone), read a round at a time: a tensor's.
template <typename T>
struct TensorRow {
    const T* x;
    __device__ __forceinline__ void load(int first, int width, int vector, float (*v)[8]) const {
        load_round(x, first, width, vector, v);
    }
};

// Or a mixture of experts' output, combined as it is read, to the bits moe.cu's moe_combine
// writes: its experts' outputs `y` [pairs, width] weighted in rank order, rounded to T (the
// row's `k` weights and pair indices). Rank by rank, so that each rank's loads of the round are
// in flight together and the code holds one copy of them, whatever k is.
template <typename T>
struct ExpertRow {
    const float* y;
    const float* weights;
    const int* pair_of;
    int k;
    __device__ __forceinline__ void load(int first, int width, int vector, float (*v)[8]) const {
#pragma unroll
        for (int j = 0; j < RMS_VECTORS; ++j)
#pragma unroll
            for (int i = 0; i < 8; ++i) v[j][i] = 0.f;
        for (int rank = 0; rank < k; ++rank) {
            const float weight = weights[rank];
            float part[RMS_VECTORS][8];
            load_round(y + (size_t)pair_of[rank] * width, first, width, vector, part);
#pragma unroll
            for (int j = 0; j < RMS_VECTORS; ++j) {
                if (8 * (first + j * RMS_THREADS) >= width) break;
#pragma unroll
                for (int i = 0; i < 8; ++i) v[j][i] = __fadd_rn(v[j][i], __fmul_rn(weight, part[j][i]));
            }
        }
#pragma unroll
        for (int j = 0; j < RMS_VECTORS; ++j)
#pragma unroll
            for (int i = 0; i < 8; ++i) v[j][i] = to_f32(from_f32<T>(v[j][i]));
    }
};

// One round of a row from vector `first` (`load_round`'s): x plus the residual where there is
// one, each sum rounded to T, written to `sum_out` and left in `v` as f32; returns the thread's
// running sum of their squares from `squares`.
template <typename T, typename Row>
__device__ __forceinline__ float add_round(T* sum_out, const Row& x, const T* residual, int first, int width,
                                           int vector, float squares, float (*v)[8]) {
    const int vectors = (width + 7) / 8;
    float r[RMS_VECTORS][8];
    x.load(first, width, vector, v);
    if (residual) load_round(residual, first, width, vector, r);
#pragma unroll
    for (int j = 0; j < RMS_VECTORS; ++j) {
        const int n = first + j * RMS_THREADS;
        if (n >= vectors) break;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if (residual && 8 * n + i < width) {
                const T sum = from_f32<T>(v[j][i] + r[j][i]);
                sum_out[8 * n + i] = sum;
                v[j][i] = to_f32(sum);
            }
            squares = fmaf(v[j][i], v[j][i], squares);
        }
    }
    return squares;
}

// One round of the normed row from vector `first`: weight * T(v * inv), as T.
template <typename T>
__device__ __forceinline__ void write_round(T* normed, int first, int width, float inv, const float (*v)[8],
                                            const float (*w)[8]) {
    const int vectors = (width + 7) / 8;
#pragma unroll
    for (int j = 0; j < RMS_VECTORS; ++j) {
        const int n = first + j * RMS_THREADS;
        if (n >= vectors) break;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (8 * n + i < width) normed[8 * n + i] = from_f32<T>(w[j][i] * to_f32(from_f32<T>(v[j][i] * inv)));
    }
}

// One row, by the block: `normed` = weight * norm(x + residual), the sum written to `sum_out`
// (both null without a residual). The entry points below say where each row lies. A row of
// one round (up to RMS_THREADS * RMS_VECTORS * 8 wide: every decode step's) stays in registers
// between the sum of squares and the output, and its weight is read with it, so the block
// waits on memory once; a wider row is read again, a round at a time, after the sum.
template <typename T, typename W, typename Row>
__device__ void rms_norm(T* normed, T* sum_out, const Row x, const T* residual, const W* weight, int width,
                         float eps, int vector) {
    __shared__ float scratch[32];
    const int vectors = (width + 7) / 8, round = RMS_THREADS * RMS_VECTORS;
    float v[RMS_VECTORS][8], w[RMS_VECTORS][8];
    if (vectors <= round) {
        load_round(weight, threadIdx.x, width, vector, w);
        const float squares = add_round(sum_out, x, residual, threadIdx.x, width, vector, 0.f, v);
        write_round(normed, threadIdx.x, width, rsqrtf(block_sum(squares, scratch) / width + eps), v, w);
        return;
    }
    float squares = 0.f;
    for (int first = threadIdx.x; first < vectors; first += round)
        squares = add_round(sum_out, x, residual, first, width, vector, squares, v);
    const float inv = rsqrtf(block_sum(squares, scratch) / width + eps);
    for (int first = threadIdx.x; first < vectors; first += round) {
        if (residual)
            load_round(sum_out, first, width, vector, v);
        else
            x.load(first, width, vector, v);
        load_round(weight, first, width, vector, w);
        write_round(normed, first, width, inv, v, w);
    }
}

// Row blockIdx.x of x [rows, width]; with a residual, `out` holds the normed rows, then the
// sums.
#define RMS_NORM(NAME, T, W)                                                                   \
    extern "C" __global__ void __launch_bounds__(RMS_THREADS)                                  \
        NAME(T* out, const T* x, const T* residual, const W* weight, int width, float eps, int vector) { \
        const size_t base = (size_t)blockIdx.x * width;                                        \
        T* sums = residual ? out + (size_t)gridDim.x * width + base : nullptr;                 \
        rms_norm<T, W>(out + base, sums, TensorRow<T>{x + base}, residual ? residual + base : nullptr, \
                       weight, width, eps, vector);                                            \
    }

RMS_NORM(rms_norm_f32_f32, float, float)
RMS_NORM(rms_norm_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
RMS_NORM(rms_norm_bf16_f32, __nv_bfloat16, float)

// The residual add of a mixture of experts' output and its norm, with moe_combine fused in: as
// rms_norm with x = moe_combine's output, in one launch and with no [rows, width] tensor between.
// `vector` speaks for the residual and the weight.
#define EXPERTS_ADD_RMS_NORM(NAME, T, W)                                                       \
    extern "C" __global__ void __launch_bounds__(RMS_THREADS)                                  \
        NAME(T* out, const float* y, const float* weights, const int* pair_of, int k, const T* residual, \
             const W* weight, int width, float eps, int vector) {                              \
        const size_t base = (size_t)blockIdx.x * width;                                        \
        const int pairs = blockIdx.x * k;                                                      \
        rms_norm<T, W>(out + base, out + (size_t)gridDim.x * width + base,                     \
                       ExpertRow<T>{y, weights + pairs, pair_of + pairs, k}, residual + base, weight, width, \
                       eps, vector);                                                           \
    }

EXPERTS_ADD_RMS_NORM(experts_add_rms_norm_f32_f32, float, float)
EXPERTS_ADD_RMS_NORM(experts_add_rms_norm_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
EXPERTS_ADD_RMS_NORM(experts_add_rms_norm_bf16_f32, __nv_bfloat16, float)

// Two RMSNorms side by side in one launch: row blockIdx.x of `a` normed by `wa` into the first
// `width` columns of `out` [rows, 2 * width], of `b` by `wb` into the rest (blockIdx.y picks);
// an EAGLE drafter's first layer reads its two normed inputs so, with no concatenation.
#define RMS_NORM_PAIR(NAME, T, W)                                                              \
    extern "C" __global__ void __launch_bounds__(RMS_THREADS)                                  \
        NAME(T* out, const T* a, const W* wa, const T* b, const W* wb, int width, float eps, int vector) { \
        const size_t base = (size_t)blockIdx.x * width;                                        \
        const T* x = blockIdx.y ? b + base : a + base;                                         \
        rms_norm<T, W>(out + 2 * base + blockIdx.y * width, nullptr, TensorRow<T>{x}, nullptr,  \
                       blockIdx.y ? wb : wa, width, eps, vector);                              \
    }

RMS_NORM_PAIR(rms_norm_pair_f32_f32, float, float)
RMS_NORM_PAIR(rms_norm_pair_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
RMS_NORM_PAIR(rms_norm_pair_bf16_f32, __nv_bfloat16, float)

// Rotary position embedding, rotate-halves layout (HF Llama, Qwen3, gpt-oss): row r of
// `x` [rows, heads * head_dim] (row stride `x_stride` elements, so x may be a column range of
// a wider tensor) is rotated by cos and sin [rows, head_dim / 2], which carry any scaling
// (llama3, YaRN and its attention factor) already. A row's pairs are dealt to gridDim.y
// blocks, so that a decode step's one row is not one block's long chain of loads.
#include "common.cuh"

template <typename T>
__device__ void rope(T* out, const T* x, const float* cos, const float* sin, int width,
                     int head_dim, int x_stride) {
    const int row = blockIdx.x, half = head_dim / 2;
    const T* src = x + (size_t)row * x_stride;
    T* dst = out + (size_t)row * width;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < width / 2; i += gridDim.y * blockDim.x) {
        const int head = i / half, j = i % half;
        const int lo = head * head_dim + j, hi = lo + half;
        const float c = cos[(size_t)row * half + j], s = sin[(size_t)row * half + j];
        const float a = to_f32(src[lo]), b = to_f32(src[hi]);
        // Two products and a difference or sum, no fused multiply-add, as the CPU kernel.
        dst[lo] = from_f32<T>(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
        dst[hi] = from_f32<T>(__fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
    }
}

#define ROPE(NAME, T)                                                                          \
    extern "C" __global__ void NAME(T* out, const T* x, const float* cos, const float* sin,    \
                                    int width, int head_dim, int x_stride) {                  \
        rope<T>(out, x, cos, sin, width, head_dim, x_stride);                                  \
    }

ROPE(rope_f32, float)
ROPE(rope_bf16, __nv_bfloat16)

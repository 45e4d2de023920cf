// RMSNorm of each row of x [rows, width], optionally fused with the residual add before it:
// sum = x + residual (rounded to T), then out = weight * T(sum * rsqrt(mean(sum^2) + eps)),
// the rounding order of HF transformers. With a residual, `out` holds 2 * rows rows: the
// normed rows, then the sums. One block of RMS_THREADS per row: the reduction tree depends on
// the width alone.
#include "common.cuh"

#define RMS_THREADS 256

template <typename T, typename W>
__device__ void rms_norm(T* out, const T* x, const T* residual, const W* weight, int width,
                         float eps) {
    __shared__ float scratch[32];
    T* sum_out = out + (size_t)gridDim.x * width;
    const size_t base = (size_t)blockIdx.x * width;
    float squares = 0.f;
    for (int i = threadIdx.x; i < width; i += RMS_THREADS) {
        float v = to_f32(x[base + i]);
        if (residual) {
            const T sum = from_f32<T>(v + to_f32(residual[base + i]));
            sum_out[base + i] = sum;
            v = to_f32(sum);
        }
        squares = fmaf(v, v, squares);
    }
    const float inv = rsqrtf(block_sum(squares, scratch) / width + eps);
    const T* src = residual ? sum_out : x;
    for (int i = threadIdx.x; i < width; i += RMS_THREADS) {
        const float normed = to_f32(from_f32<T>(to_f32(src[base + i]) * inv));
        out[base + i] = from_f32<T>(to_f32(weight[i]) * normed);
    }
}

#define RMS_NORM(NAME, T, W)                                                                   \
    extern "C" __global__ void __launch_bounds__(RMS_THREADS)                                  \
        NAME(T* out, const T* x, const T* residual, const W* weight, int width, float eps) {   \
        rms_norm<T, W>(out, x, residual, weight, width, eps);                                  \
    }

RMS_NORM(rms_norm_f32_f32, float, float)
RMS_NORM(rms_norm_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
RMS_NORM(rms_norm_bf16_f32, __nv_bfloat16, float)

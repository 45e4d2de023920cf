// SwiGLU gating of a fused projection: `gate_up` [rows, 2 * width] with the gate columns
// first gives silu(gate) * up [rows, width]. Elementwise, in f32, rounded once.
#include "common.cuh"

template <typename T>
__device__ void swiglu(T* out, const T* gate_up, int rows, int width) {
    const size_t total = (size_t)rows * width;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / width, col = i % width;
        const float g = to_f32(gate_up[row * 2 * width + col]);
        const float u = to_f32(gate_up[row * 2 * width + width + col]);
        out[i] = from_f32<T>(silu_times(g, u));
    }
}

#define SWIGLU(NAME, T)                                                                        \
    extern "C" __global__ void NAME(T* out, const T* gate_up, int rows, int width) {           \
        swiglu<T>(out, gate_up, rows, width);                                                  \
    }

SWIGLU(swiglu_f32, float)
SWIGLU(swiglu_bf16, __nv_bfloat16)

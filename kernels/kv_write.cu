// Scatter of new key or value rows into the paged cache: row t of `src` [tokens, width] goes
// to row slots[t] of `cache` [slots, width], converted (rounded to nearest even) to the
// cache's element type. One block per row.
#include "common.cuh"

template <typename S, typename C>
__device__ void kv_write(C* cache, const S* src, const uint32_t* slots, int width) {
    const S* row = src + (size_t)blockIdx.x * width;
    C* dst = cache + (size_t)slots[blockIdx.x] * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = from_f32<C>(to_f32(row[i]));
}

#define KV_WRITE(NAME, S, C)                                                                  \
    extern "C" __global__ void NAME(C* cache, const S* src, const uint32_t* slots, int width) { \
        kv_write<S, C>(cache, src, slots, width);                                             \
    }

KV_WRITE(kv_write_f32_f32, float, float)
KV_WRITE(kv_write_f32_bf16, float, __nv_bfloat16)
KV_WRITE(kv_write_bf16_f32, __nv_bfloat16, float)
KV_WRITE(kv_write_bf16_bf16, __nv_bfloat16, __nv_bfloat16)

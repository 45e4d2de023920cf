// Scatter of new key or value rows into the paged cache: row t of `src` [tokens, width] (rows
// `src_stride` elements apart, so src may be a column range of a fused projection), divided by
// the cache's per-tensor `scale` (1 but for FP8), goes to row slots[t] of `cache`
// [slots, width], converted to the cache's element type (rounded to nearest even; FP8
// saturated at its largest finite value, as the CPU does). One block per row.
#include "common.cuh"

// A row whose slot is PAD_SLOT pads a batch to a fixed shape and writes nothing.
#define PAD_SLOT 0xFFFFFFFFu

template <typename S, typename C>
__device__ void kv_write(C* cache, const S* src, const uint32_t* slots, int width, int src_stride, float scale) {
    const uint32_t slot = slots[blockIdx.x];
    if (slot == PAD_SLOT) return;
    const S* row = src + (size_t)blockIdx.x * src_stride;
    C* dst = cache + (size_t)slot * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = from_f32<C>(to_f32(row[i]) / scale);
}

#define KV_WRITE(NAME, S, C)                                                                \
    extern "C" __global__ void NAME(C* cache, const S* src, const uint32_t* slots, int width,  \
                                    int src_stride, float scale) {                             \
        kv_write<S, C>(cache, src, slots, width, src_stride, scale);                           \
    }

KV_WRITE(kv_write_f32_f32, float, float)
KV_WRITE(kv_write_f32_bf16, float, __nv_bfloat16)
KV_WRITE(kv_write_bf16_f32, __nv_bfloat16, float)
KV_WRITE(kv_write_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
KV_WRITE(kv_write_f32_f8e4m3, float, __nv_fp8_e4m3)
KV_WRITE(kv_write_bf16_f8e4m3, __nv_bfloat16, __nv_fp8_e4m3)

// Scatter of a batch's new keys and values into a layer's paged cache, both in one launch: row
// t of `k` and of `v` [tokens, width] (rows `k_stride` and `v_stride` elements apart, so either
// may be a column range of a fused projection), divided by the cache's per-tensor scales (1 but
// for FP8), go to row slots[t] of `cache` [2, slots, width], the keys into its first half and
// the values into its second, converted to the cache's element type (rounded to nearest even;
// FP8 saturated at its largest finite value, as the CPU does). Block (t, 0) writes row t's
// keys, block (t, 1) its values.
#include "common.cuh"

// A row whose slot is PAD_SLOT pads a batch to a fixed shape and writes nothing.
#define PAD_SLOT 0xFFFFFFFFu

template <typename S, typename C>
__device__ void kv_write(C* cache, const S* k, const S* v, const uint32_t* slots, int num_slots, int width,
                         int k_stride, int v_stride, float k_scale, float v_scale) {
    const uint32_t slot = slots[blockIdx.x];
    if (slot == PAD_SLOT) return;
    const bool values = blockIdx.y == 1;
    const S* row = values ? v + (size_t)blockIdx.x * v_stride : k + (size_t)blockIdx.x * k_stride;
    const float scale = values ? v_scale : k_scale;
    C* dst = cache + ((size_t)blockIdx.y * num_slots + slot) * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = from_f32<C>(to_f32(row[i]) / scale);
}

#define KV_WRITE(NAME, S, C)                                                                 \
    extern "C" __global__ void NAME(C* cache, const S* k, const S* v, const uint32_t* slots, \
                                    int num_slots, int width, int k_stride, int v_stride,    \
                                    float k_scale, float v_scale) {                          \
        kv_write<S, C>(cache, k, v, slots, num_slots, width, k_stride, v_stride, k_scale,    \
                       v_scale);                                                             \
    }

KV_WRITE(kv_write_f32_f32, float, float)
KV_WRITE(kv_write_f32_bf16, float, __nv_bfloat16)
KV_WRITE(kv_write_bf16_f32, __nv_bfloat16, float)
KV_WRITE(kv_write_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
KV_WRITE(kv_write_f32_f8e4m3, float, __nv_fp8_e4m3)
KV_WRITE(kv_write_bf16_f8e4m3, __nv_bfloat16, __nv_fp8_e4m3)

// Scatter of a batch's new keys and values into a layer's paged cache, both in one launch: row
// t of `k` and of `v` [tokens, width] (rows `k_stride` and `v_stride` elements apart, so either
// may be a column range of a fused projection), divided by the cache's per-tensor scales (1 but
// for FP8), go to row slots[t] of `cache` [2, slots, width], the keys into its first half and
// the values into its second, converted to the cache's element type (rounded to nearest even;
// FP8 saturated at its largest finite value, as the CPU does). Block (t, 0) writes row t's
// keys, block (t, 1) its values.
//
// Where `rotation` is not null, the keys are rotated as they are read, per `head_dim` head, by
// its tables [2, tokens, head_dim / 2] (cos, then sin): each element by rope.cu's arithmetic,
// rounded to the keys' type, as a launch of rope.cu would have written it.
#include "common.cuh"

// A row whose slot is PAD_SLOT pads a batch to a fixed shape and writes nothing.
#define PAD_SLOT 0xFFFFFFFFu

// Element i of row `t` of `x`, rotated by row t of `tables` where tables is not null: rope.cu's
// two products and a difference or sum, no fused multiply-add, rounded to T.
template <typename T>
__device__ __forceinline__ float rotated(const T* row, int i, const float* tables, int t, int tokens, int head_dim) {
    if (!tables) return to_f32(row[i]);
    const int half = head_dim / 2, d = i % head_dim, j = d % half, lo = i - d + j;
    const float c = tables[(size_t)t * half + j], s = tables[((size_t)tokens + t) * half + j];
    const float a = to_f32(row[lo]), b = to_f32(row[lo + half]);
    const float r = d < half ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    return to_f32(from_f32<T>(r));
}

template <typename S, typename C>
__device__ void kv_write(C* cache, const S* k, const S* v, const uint32_t* slots, const float* rotation,
                         int num_slots, int width, int k_stride, int v_stride, int head_dim, float k_scale,
                         float v_scale) {
    const uint32_t slot = slots[blockIdx.x];
    if (slot == PAD_SLOT) return;
    const int tokens = gridDim.x;
    C* dst = cache + ((size_t)blockIdx.y * num_slots + slot) * width;
    if (blockIdx.y == 1) {
        const S* row = v + (size_t)blockIdx.x * v_stride;
        for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = from_f32<C>(to_f32(row[i]) / v_scale);
        return;
    }
    const S* row = k + (size_t)blockIdx.x * k_stride;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        dst[i] = from_f32<C>(rotated(row, i, rotation, blockIdx.x, tokens, head_dim) / k_scale);
}

#define KV_WRITE(NAME, S, C)                                                                   \
    extern "C" __global__ void NAME(C* cache, const S* k, const S* v, const uint32_t* slots,   \
                                    const float* rotation, int num_slots, int width,           \
                                    int k_stride, int v_stride, int head_dim, float k_scale,   \
                                    float v_scale) {                                           \
        kv_write<S, C>(cache, k, v, slots, rotation, num_slots, width, k_stride, v_stride,     \
                       head_dim, k_scale, v_scale);                                            \
    }

KV_WRITE(kv_write_f32_f32, float, float)
KV_WRITE(kv_write_f32_bf16, float, __nv_bfloat16)
KV_WRITE(kv_write_bf16_f32, __nv_bfloat16, float)
KV_WRITE(kv_write_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
KV_WRITE(kv_write_f32_f8e4m3, float, __nv_fp8_e4m3)
KV_WRITE(kv_write_bf16_f8e4m3, __nv_bfloat16, __nv_fp8_e4m3)

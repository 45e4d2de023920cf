// Scatter of a batch's new keys and values into a layer's paged cache, both in one launch: row
// t of `k` and of `v` [tokens, width] (rows `k_stride` and `v_stride` elements apart, so either
// may be a column range of a fused projection), divided by the cache's per-tensor scales (1 but
// for FP8), go to row slots[t] of `cache` [2, slots, width], the keys into its first half and
// the values into its second, converted to the cache's element type (rounded to nearest even;
// FP8 saturated at its largest finite value, as the CPU does). Block (t, 0) writes row t's
// keys, block (t, 1) its values.
//
// Where `rotation` is not null, the keys are rotated as they are read, per `head_dim` head, by
// its tables [2, table_len, head_dim / 2] (cos, then sin), row t by table row
// `table_rows[t]` (row t where that is null: common.cuh's rotary_pair): each element by
// rope.cu's arithmetic, rounded to the keys' type, as a launch of rope.cu would have written it.
#include "common.cuh"

// A row whose slot is PAD_SLOT pads a batch to a fixed shape and writes nothing.
#define PAD_SLOT 0xFFFFFFFFu

// Element i of row `t` of `x`, rotated by its row of `rotation` where that is not null,
// rounded to T.
template <typename T>
__device__ __forceinline__ float rotated(const T* row, int i, const float* rotation, const uint32_t* table_rows,
                                         int table_len, int t, int head_dim) {
    if (!rotation) return to_f32(row[i]);
    const int half = head_dim / 2, d = i % head_dim, j = d % half, lo = i - d + j;
    const float2 cos_sin = rotary_pair(rotation, table_rows, table_len, t, j, half);
    return to_f32(from_f32<T>(rotate_element(to_f32(row[lo]), to_f32(row[lo + half]), cos_sin, d < half)));
}

template <typename S, typename C>
__device__ void kv_write(C* cache, const S* k, const S* v, const uint32_t* slots, const float* rotation,
                         const uint32_t* table_rows, int table_len, int num_slots, int width, int k_stride,
                         int v_stride, int head_dim, float k_scale, float v_scale) {
    const uint32_t slot = slots[blockIdx.x];
    if (slot == PAD_SLOT) return;
    C* dst = cache + ((size_t)blockIdx.y * num_slots + slot) * width;
    if (blockIdx.y == 1) {
        const S* row = v + (size_t)blockIdx.x * v_stride;
        for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = from_f32<C>(to_f32(row[i]) / v_scale);
        return;
    }
    const S* row = k + (size_t)blockIdx.x * k_stride;
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        dst[i] = from_f32<C>(rotated(row, i, rotation, table_rows, table_len, blockIdx.x, head_dim) / k_scale);
}

#define KV_WRITE(NAME, S, C)                                                                    \
    extern "C" __global__ void NAME(C* cache, const S* k, const S* v, const uint32_t* slots,    \
                                    const float* rotation, const uint32_t* table_rows,          \
                                    int table_len, int num_slots, int width, int k_stride,      \
                                    int v_stride, int head_dim, float k_scale, float v_scale) { \
        kv_write<S, C>(cache, k, v, slots, rotation, table_rows, table_len, num_slots, width,   \
                       k_stride, v_stride, head_dim, k_scale, v_scale);                         \
    }

KV_WRITE(kv_write_f32_f32, float, float)
KV_WRITE(kv_write_f32_bf16, float, __nv_bfloat16)
KV_WRITE(kv_write_bf16_f32, __nv_bfloat16, float)
KV_WRITE(kv_write_bf16_bf16, __nv_bfloat16, __nv_bfloat16)
KV_WRITE(kv_write_f32_f8e4m3, float, __nv_fp8_e4m3)
KV_WRITE(kv_write_bf16_f8e4m3, __nv_bfloat16, __nv_fp8_e4m3)

// Shared helpers of peagle's kernels: element conversion and fixed-order block reductions.
//
// Batch invariance rule for every kernel here: the floating-point operations that produce one
// output element depend only on that element's own inputs and on shapes fixed by the model
// (widths, head sizes), never on how many rows share the launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__nv_fp8_e4m3 x) { return float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}
// Rounded to nearest even, saturated at ±448.
template <> __device__ __forceinline__ __nv_fp8_e4m3 from_f32<__nv_fp8_e4m3>(float x) {
    return __nv_fp8_e4m3(x);
}

// A pair of bf16 values from its bits (the first in the low half), and back.
__device__ __forceinline__ __nv_bfloat162 bf16_pair(uint32_t bits) { return *reinterpret_cast<__nv_bfloat162*>(&bits); }
__device__ __forceinline__ uint32_t bf16_pair_bits(__nv_bfloat162 pair) { return *reinterpret_cast<uint32_t*>(&pair); }

// v[0..8] = p[0..8] widened to f32, in one vector load: p must be 16-byte aligned (8-byte
// for FP8).
__device__ __forceinline__ void load8(const float* p, float* v) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

__device__ __forceinline__ void load8(const __nv_fp8_e4m3* p, float* v) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const __nv_fp8_e4m3* bytes = reinterpret_cast<const __nv_fp8_e4m3*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = float(bytes[i]);
}

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* v) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(pairs[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

// Rotary tables [2, table_len, half] (cos, then sin) as the KV write and attention read them:
// the cos and sin of pair j for row t, from table row `table_rows[t]` where that is not null
// (a table of every position, indexed by each row's position), else from table row t (a
// batch's own tables). An index past the table reads its last row: the host checks indices
// before they reach a kernel, and no launch reads out of bounds whatever they hold.
__device__ __forceinline__ float2 rotary_pair(const float* tables, const uint32_t* table_rows, int table_len,
                                              int t, int j, int half) {
    const size_t r = table_rows ? min(table_rows[t], (uint32_t)table_len - 1) : (size_t)t;
    return make_float2(tables[r * half + j], tables[((size_t)table_len + r) * half + j]);
}

// One element of a head rotated by rope.cu's arithmetic (two products and a difference or sum,
// no fused multiply-add): `a` and `b` are pair j's elements in the head's two halves, `first`
// whether the element is in the first half.
__device__ __forceinline__ float rotate_element(float a, float b, float2 cos_sin, bool first) {
    return first ? __fsub_rn(__fmul_rn(a, cos_sin.x), __fmul_rn(b, cos_sin.y))
                 : __fadd_rn(__fmul_rn(a, cos_sin.y), __fmul_rn(b, cos_sin.x));
}

// SwiGLU's gating of one gate and up value, in f32: silu(g) * u as g / (1 + e^-g) * u. Every
// kernel that gates (swiglu.cu, linear_mma.cu's SwiGLU forms) computes it here, to the same bits.
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.f + expf(-g)) * u; }

// Rust's total_cmp order as an unsigned integer's: the larger key comes later in the order
// (-NaN, -inf, ..., -0, +0, ..., +inf, +NaN), so a selection by key is total and matches the
// CPU's sort whatever the values.
__device__ __forceinline__ uint32_t order_key(float x) {
    const uint32_t bits = __float_as_uint(x);
    return bits ^ ((bits & 0x80000000u) ? 0xffffffffu : 0x80000000u);
}

struct Sum {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
    static constexpr float identity = 0.f;
};

struct Max {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
    static constexpr float identity = -INFINITY;
};

// Reduction over a warp by a butterfly: every lane gets the same result. The CUDA emulator
// runs the same butterfly in one exchange of the lanes' values (emu::butterfly): its warps
// pay a switch of every lane for each collective.
template <typename Op> __device__ __forceinline__ float warp_reduce(float v, Op op) {
#ifdef PEAGLE_CUDA_EMULATION
    return emu::butterfly(v, op);
#else
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffff, v, offset));
    return v;
#endif
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, Sum()); }

// Reduction over the block, the same tree for a given blockDim: a butterfly in each warp, then
// the warps' results in warp order. Every thread gets the result. `scratch` holds 32 floats;
// the call synchronises before and after using it.
template <typename Op> __device__ __forceinline__ float block_reduce(float v, float* scratch, Op op) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = Op::identity;
    for (int w = 0; w < warps; ++w) total = op(total, scratch[w]);
    return total;
}

__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce(v, scratch, Sum()); }
__device__ __forceinline__ float block_max(float v, float* scratch) { return block_reduce(v, scratch, Max()); }

// The device side of peagle's CUDA emulator, included ahead of every kernel source it compiles
// as host C++ (see README.md): CUDA's own headers give the element types and their
// conversions, which they implement for the host too; this file gives what only a GPU has,
// the thread indices, shared memory, barriers, warp collectives, atomics and the tensor-core
// instruction, over the fibers of fibers.cpp.
//
// A block runs on one host thread, its CUDA threads as fibers that switch only at a barrier or
// a warp collective. So an atomic is a plain read-modify-write, and `__shared__` is `static`:
// one block runs at a time, and all of its threads see the same variable.
#pragma once

#define PEAGLE_CUDA_EMULATION 1
// Before CUDA's headers, which keep a definition they find.
#define __shared__ static
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

// After CUDA's headers, which read it to choose device code (inline PTX) over host code: the
// kernels read it to know which element types the device has (bf16 from 8.0).
#define __CUDA_ARCH__ 800

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>

// The calling fiber's place in the launch, set by the scheduler before it resumes a fiber.
extern dim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

namespace emu {
// Waits for every live thread of the block.
void block_barrier();
// Waits for the live lanes of `mask` in the caller's warp; then each lane's `size` bytes at
// `value` are readable by all of them through `lane_value` until the warp's next collective.
void warp_exchange(unsigned mask, const void* value, size_t size);
const void* lane_value(int lane);
// The lanes of the caller's warp that have not exited.
unsigned live_lanes();
// The lanes that joined the caller's last warp collective (some may have exited since).
unsigned joined_lanes();
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 over the caller's warp.
void mma_m16n8k16_bf16(float* d, const uint32_t* a, const uint32_t* b);
// Ends the launch with an error, as a trap on a GPU does.
[[noreturn]] void trap(const char* why);
}  // namespace emu

inline void __syncthreads() { emu::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::warp_exchange(mask, nullptr, 0); }
inline unsigned __activemask() { return emu::live_lanes(); }
inline void __trap() { emu::trap("__trap()"); }

namespace emu {
inline int lane_id() { return static_cast<int>(threadIdx.x % 32); }

// A shuffle: the value of lane `source` of the caller's segment of `width` lanes, or the
// caller's own where `source` is outside it.
template <typename T> T shuffle(unsigned mask, T v, int source, int width) {
    warp_exchange(mask, &v, sizeof(T));
    const int lane = lane_id(), base = lane - lane % width;
    if (source < base || source >= base + width) return v;
    T out;
    std::memcpy(&out, lane_value(source), sizeof(T));
    return out;
}

// The xor butterfly over a full warp, `for offset in 16, 8, 4, 2, 1: v = op(v, shuffle of v
// from lane ^ offset)`, in one collective where the shuffles take five: the lanes' values are
// exchanged once, and each lane then runs the rounds on its own copy of them, over just the 31
// values its result depends on (after the round of `offset`, those of the lanes that share its
// bits from `offset` up). The same operations on the same values as the shuffles.
template <typename T, typename Op> T butterfly(T v, Op op) {
    warp_exchange(0xffffffffu, &v, sizeof(T));
    // The lanes' slots lie evenly apart: two calls find them all.
    const auto* first = static_cast<const unsigned char*>(lane_value(0));
    const auto stride = static_cast<const unsigned char*>(lane_value(1)) - first;
    T level[32];
    for (int l = 0; l < 32; ++l) std::memcpy(&level[l], first + l * stride, sizeof(T));
    const int lane = lane_id();
    for (int offset = 16; offset > 0; offset /= 2)
        for (int i = 0, first = lane & ~(offset - 1); i < offset; ++i) {
            const int x = first | i;
            level[x] = op(level[x], level[x ^ offset]);
        }
    return level[lane];
}
}  // namespace emu

template <typename T> T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const int lane = emu::lane_id();
    return emu::shuffle(mask, v, lane - lane % width + src % width, width);
}
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return emu::shuffle(mask, v, emu::lane_id() ^ lane_mask, width);
}
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return emu::shuffle(mask, v, emu::lane_id() + static_cast<int>(delta), width);
}
template <typename T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    return emu::shuffle(mask, v, emu::lane_id() - static_cast<int>(delta), width);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) {
    const int p = predicate != 0;
    emu::warp_exchange(mask, &p, sizeof p);
    unsigned ballot = 0;
    for (int lane = 0; lane < 32; ++lane)
        if ((emu::joined_lanes() >> lane & 1) && *static_cast<const int*>(emu::lane_value(lane))) ballot |= 1u << lane;
    return ballot;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
    const unsigned ballot = __ballot_sync(mask, predicate);
    return ballot == emu::joined_lanes();
}

// Atomics: fibers switch only at barriers, so nothing runs between the read and the write.
template <typename T, typename U> T atomicAdd(T* p, U v) { const T old = *p; *p = old + T(v); return old; }
template <typename T, typename U> T atomicSub(T* p, U v) { const T old = *p; *p = old - T(v); return old; }
template <typename T, typename U> T atomicMax(T* p, U v) { const T old = *p; *p = old < T(v) ? T(v) : old; return old; }
template <typename T, typename U> T atomicMin(T* p, U v) { const T old = *p; *p = T(v) < old ? T(v) : old; return old; }
template <typename T, typename U> T atomicExch(T* p, U v) { const T old = *p; *p = T(v); return old; }
template <typename T, typename U> T atomicCAS(T* p, U compare, U v) { const T old = *p; if (old == T(compare)) *p = T(v); return old; }
template <typename T, typename U> T atomicOr(T* p, U v) { const T old = *p; *p = old | T(v); return old; }
template <typename T, typename U> T atomicAnd(T* p, U v) { const T old = *p; *p = old & T(v); return old; }
inline unsigned atomicInc(unsigned* p, unsigned limit) { const unsigned old = *p; *p = old >= limit ? 0 : old + 1; return old; }

template <typename T> T __ldg(const T* p) { return *p; }
// Blocks run one after another, so every write is seen by the blocks after it.
template <typename T> T __ldcg(const T* p) { return *p; }
inline void __threadfence() {}

// Bit casts and integer intrinsics.
template <typename To, typename From> To emu_bit_cast(From x) { To y; std::memcpy(&y, &x, sizeof y); return y; }
inline unsigned __float_as_uint(float x) { return emu_bit_cast<unsigned>(x); }
inline float __uint_as_float(unsigned x) { return emu_bit_cast<float>(x); }
inline int __float_as_int(float x) { return emu_bit_cast<int>(x); }
inline float __int_as_float(int x) { return emu_bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return emu_bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return emu_bit_cast<double>(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= (x >> i & 1u) << (31 - i);
    return r;
}
inline unsigned __umulhi(unsigned a, unsigned b) { return static_cast<unsigned>((static_cast<unsigned long long>(a) * b) >> 32); }
// The high word of hi:lo shifted left by shift % 32 (a rotation where lo == hi).
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
    const unsigned long long both = static_cast<unsigned long long>(hi) << 32 | lo;
    return static_cast<unsigned>(both << (shift & 31) >> 32);
}
// Byte i of the result is byte (s >> 4i) & 7 of the eight bytes y:x.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long bytes = static_cast<unsigned long long>(y) << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>(bytes >> (8 * ((s >> (4 * i)) & 7)) & 0xff) << (8 * i);
    return r;
}

// Single-precision arithmetic with its rounding stated; the kernels are compiled without
// contraction, so a plain expression is already rounded once an operation.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __frcp_rn(float a) { return 1.f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float exp10f(float x) { return std::pow(10.f, x); }
inline float normcdff(float x) { return 0.5f * std::erfc(-x / std::sqrt(2.f)); }
inline double normcdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
using std::fmaxf;
using std::fminf;
using std::isfinite;
using std::isinf;
using std::isnan;

using std::signbit;

// CUDA's min and max, global and overloaded by type: integers in their common type, floats as
// fminf and fmaxf.
template <typename A, typename B, typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
std::common_type_t<A, B> min(A a, B b) { return a < b ? a : b; }
template <typename A, typename B, typename = std::enable_if_t<std::is_integral_v<A> && std::is_integral_v<B>>>
std::common_type_t<A, B> max(A a, B b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// The half-precision functions CUDA has on the device only, through f32 (as its own are
// correctly rounded for these, the result is the same).
#define EMU_HALF_FUNCTIONS(T, TO, FROM)                                                                \
    inline T hsqrt(T a) { return FROM(std::sqrt(TO(a))); }                                          \
    inline T hrsqrt(T a) { return FROM(1.f / std::sqrt(TO(a))); }                                   \
    inline T hcos(T a) { return FROM(std::cos(TO(a))); }                                            \
    inline T hsin(T a) { return FROM(std::sin(TO(a))); }                                            \
    inline T hlog(T a) { return FROM(std::log(TO(a))); }                                            \
    inline T hexp(T a) { return FROM(std::exp(TO(a))); }                                            \
    inline T hrcp(T a) { return FROM(1.f / TO(a)); }                                                \
    inline T hfloor(T a) { return FROM(std::floor(TO(a))); }                                        \
    inline T hceil(T a) { return FROM(std::ceil(TO(a))); }                                          \
    inline T htrunc(T a) { return FROM(std::trunc(TO(a))); }
EMU_HALF_FUNCTIONS(__half, __half2float, __float2half_rn)
EMU_HALF_FUNCTIONS(__nv_bfloat16, __bfloat162float, __float2bfloat16_rn)
#undef EMU_HALF_FUNCTIONS

// Each requested row's token drawn from softmax(logits / temperature) by the Gumbel-max trick:
// the token whose scaled logit plus its Gumbel noise is largest. A token's noise depends only
// on the request's key and the token's index (a counter-based hash), so a row's draw depends
// on its logits and its key alone, whatever else the launch holds.
//
// score(i) = (double)((logit_i - max) / temperature) - log(-log(u_i)), u_i in (0, 1] from the
// top 53 bits of splitmix64(key + (i + 1) * golden); a logit equal to the max scales to 0, so a
// row with +inf logits draws among those alone. The largest score wins, the lower index on a
// tie; NaN logits are never chosen; a row with nothing else gives 0.
#include "common.cuh"

#define GUMBEL_THREADS 256

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ double gumbel(uint64_t key, int index) {
    const uint64_t bits = splitmix64(key + (uint64_t)(index + 1) * 0x9e3779b97f4a7c15ull);
    const double u = (double)((bits >> 11) + 1) * 0x1.0p-53;
    return -log(-log(u));
}

// The better of two picks: the larger score, the lower index on a tie; `cols` is no pick.
__device__ __forceinline__ void better(double& best, int& index, double other, int other_index, int cols) {
    if (other_index == cols) return;
    if (index == cols || other > best || (other == best && other_index < index)) {
        best = other;
        index = other_index;
    }
}

template <typename T>
__device__ void gumbel_sample(uint32_t* out, const T* logits, const uint32_t* rows, const float* temperatures,
                              const uint64_t* keys, int cols) {
    __shared__ float maxes[GUMBEL_THREADS / 32];
    __shared__ double bests[GUMBEL_THREADS / 32];
    __shared__ int indices[GUMBEL_THREADS / 32];
    const int request = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const T* row = logits + (size_t)rows[request] * cols;

    float largest = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += GUMBEL_THREADS) largest = fmaxf(largest, to_f32(row[c]));
    const float max = block_max(largest, maxes);

    const float temperature = temperatures[request];
    const uint64_t key = keys[request];
    double best = -INFINITY;
    int index = cols;
    for (int c = threadIdx.x; c < cols; c += GUMBEL_THREADS) {
        const float logit = to_f32(row[c]);
        if (isnan(logit)) continue;
        const float scaled = logit == max ? 0.f : (logit - max) / temperature;
        const double score = (double)scaled + gumbel(key, c);
        if (index == cols || score > best) {
            best = score;
            index = c;
        }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const double other = __shfl_xor_sync(0xffffffff, best, offset);
        const int other_index = __shfl_xor_sync(0xffffffff, index, offset);
        better(best, index, other, other_index, cols);
    }
    if (lane == 0) {
        bests[warp] = best;
        indices[warp] = index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < GUMBEL_THREADS / 32; ++w) better(best, index, bests[w], indices[w], cols);
        out[request] = index == cols ? 0 : index;
    }
}

#define GUMBEL_SAMPLE(NAME, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(GUMBEL_THREADS)                                     \
        NAME(uint32_t* out, const T* logits, const uint32_t* rows, const float* temperatures,        \
             const uint64_t* keys, int cols) {                                                       \
        gumbel_sample<T>(out, logits, rows, temperatures, keys, cols);                               \
    }

GUMBEL_SAMPLE(gumbel_sample_f32, float)
GUMBEL_SAMPLE(gumbel_sample_bf16, __nv_bfloat16)

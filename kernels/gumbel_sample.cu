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

// A row is dealt to blocks in chunks of GUMBEL_CHUNK logits, so that a vocabulary's f64
// noise (two logarithms a token) is drawn by many SMs, not one: 50 for gpt-oss's 201,088.
// The max of a row and the best of its scores do not depend on how the row is dealt: a max of
// floats is one of them whatever the order (a zero's sign aside, which no score sees: a logit
// equal to the max scales to 0), and `better` is a total order on (score, index). Where a row
// is one chunk, `gumbel_sample` alone draws it; otherwise `gumbel_chunk_max` finds each
// chunk's max, `gumbel_sample` each chunk's best from the row's max, and `gumbel_pick` the
// row's best of those.
#define GUMBEL_CHUNK 4096

// The logits of request `blockIdx.x`'s row in chunk `blockIdx.y`: [first, end).
template <typename T>
__device__ __forceinline__ const T* chunk_of(const T* logits, const uint32_t* rows, int cols, int* first, int* end) {
    *first = blockIdx.y * GUMBEL_CHUNK;
    *end = min(cols, *first + GUMBEL_CHUNK);
    return logits + (size_t)rows[blockIdx.x] * cols;
}

template <typename T>
__device__ float chunk_max(const T* row, int first, int end, float* scratch) {
    float largest = -INFINITY;
    for (int c = first + threadIdx.x; c < end; c += GUMBEL_THREADS) largest = fmaxf(largest, to_f32(row[c]));
    return block_max(largest, scratch);
}

// maxes[request * chunks + chunk]: the chunk's largest logit.
template <typename T>
__device__ void gumbel_chunk_max(float* maxes, const T* logits, const uint32_t* rows, int cols) {
    __shared__ float scratch[32];
    int first, end;
    const T* row = chunk_of(logits, rows, cols, &first, &end);
    const float max = chunk_max(row, first, end, scratch);
    if (threadIdx.x == 0) maxes[blockIdx.x * gridDim.y + blockIdx.y] = max;
}

// The best score of the chunk, from the row's max: into out[request] where the row is one
// chunk, else into bests and indices [request * chunks + chunk].
template <typename T>
__device__ void gumbel_sample(uint32_t* out, double* bests, int* indices, const float* maxes, const T* logits,
                              const uint32_t* rows, const float* temperatures, const uint64_t* keys, int cols) {
    __shared__ float scratch[32];
    __shared__ double chunk_bests[GUMBEL_THREADS / 32];
    __shared__ int chunk_indices[GUMBEL_THREADS / 32];
    const int request = blockIdx.x, chunks = gridDim.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int first, end;
    const T* row = chunk_of(logits, rows, cols, &first, &end);
    float max = -INFINITY;
    if (chunks == 1) {
        max = chunk_max(row, first, end, scratch);
    } else {
        for (int c = 0; c < chunks; ++c) max = fmaxf(max, maxes[request * chunks + c]);
    }

    const float temperature = temperatures[request];
    const uint64_t key = keys[request];
    double best = -INFINITY;
    int index = cols;
    for (int c = first + threadIdx.x; c < end; c += GUMBEL_THREADS) {
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
        chunk_bests[warp] = best;
        chunk_indices[warp] = index;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < GUMBEL_THREADS / 32; ++w) better(best, index, chunk_bests[w], chunk_indices[w], cols);
    if (chunks == 1) {
        out[request] = index == cols ? 0 : index;
    } else {
        bests[request * chunks + blockIdx.y] = best;
        indices[request * chunks + blockIdx.y] = index;
    }
}

// out[request]: the best of the request's chunks. One thread per request.
extern "C" __global__ void gumbel_pick(uint32_t* out, const double* bests, const int* indices, int requests,
                                       int chunks, int cols) {
    const int request = blockIdx.x * blockDim.x + threadIdx.x;
    if (request >= requests) return;
    double best = -INFINITY;
    int index = cols;
    for (int c = 0; c < chunks; ++c) better(best, index, bests[request * chunks + c], indices[request * chunks + c], cols);
    out[request] = index == cols ? 0 : index;
}

#define GUMBEL_SAMPLE(T_NAME, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(GUMBEL_THREADS)                                     \
        gumbel_chunk_max_##T_NAME(float* maxes, const T* logits, const uint32_t* rows, int cols) {   \
        gumbel_chunk_max<T>(maxes, logits, rows, cols);                                              \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(GUMBEL_THREADS)                                     \
        gumbel_sample_##T_NAME(uint32_t* out, double* bests, int* indices, const float* maxes,       \
                               const T* logits, const uint32_t* rows, const float* temperatures,     \
                               const uint64_t* keys, int cols) {                                     \
        gumbel_sample<T>(out, bests, indices, maxes, logits, rows, temperatures, keys, cols);        \
    }

GUMBEL_SAMPLE(f32, float)
GUMBEL_SAMPLE(bf16, __nv_bfloat16)

// The argmax of each requested row: the first index of its largest value, NaN never chosen (a
// row of NaN gives 0). One block per requested row (`rows[b]` is block b's; with no `rows`,
// row b is, so that a step asking for every row uploads no list of them); each thread scans
// its elements in index order, then the threads' picks meet, the larger value winning and the
// lower index on a tie, so the result is the one a scan in index order finds, whatever the
// block size and however the elements are dealt to threads.
//
// A decode step's row is a whole vocabulary (201,088 logits for gpt-oss) for one block: where
// the launcher says the rows allow it (`vector`: cols % 8 == 0, x 16-byte aligned), a thread
// reads eight elements a load, several loads in flight, so that the block waits on the memory
// a few dozen times rather than a few hundred.
#include "common.cuh"

#define ARGMAX_THREADS 256
// Loads of eight elements a thread has in flight.
#define ARGMAX_LOADS 4

// The better of two picks: the larger value, the lower index on a tie; `cols` is no pick.
__device__ __forceinline__ void better(float& best, int& index, float other, int other_index, int cols) {
    if (other_index == cols) return;
    if (index == cols || other > best || (other == best && other_index < index)) {
        best = other;
        index = other_index;
    }
}

// A thread's scan, element `c` of value `v` after every element before it: a larger value
// wins, and the first element wins where nothing has (so a row of -inf gives its first).
__device__ __forceinline__ void scan(float& best, int& index, float v, int c, int cols) {
    const bool take = v > best || (index == cols && v == best);
    best = take ? v : best;
    index = take ? c : index;
}

template <typename T>
__device__ void argmax_rows(uint32_t* out, const T* x, const uint32_t* rows, int cols, int vector) {
    __shared__ float bests[ARGMAX_THREADS / 32];
    __shared__ int indices[ARGMAX_THREADS / 32];
    const T* row = x + (size_t)(rows ? rows[blockIdx.x] : blockIdx.x) * cols;
    float best = -INFINITY;
    int index = cols;
    if (vector) {
        // ARGMAX_LOADS loads issued before any is scanned; the scan keeps index order.
        const int stride = 8 * ARGMAX_THREADS;
        for (int first = 8 * threadIdx.x; first < cols; first += ARGMAX_LOADS * stride) {
            float v[ARGMAX_LOADS][8];
#pragma unroll
            for (int u = 0; u < ARGMAX_LOADS; ++u)
                if (first + u * stride < cols) load8(row + first + u * stride, v[u]);
#pragma unroll
            for (int u = 0; u < ARGMAX_LOADS; ++u)
                if (first + u * stride < cols)
#pragma unroll
                    for (int i = 0; i < 8; ++i) scan(best, index, v[u][i], first + u * stride + i, cols);
        }
    } else {
        for (int c = threadIdx.x; c < cols; c += ARGMAX_THREADS) scan(best, index, to_f32(row[c]), c, cols);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
        const float other = __shfl_xor_sync(0xffffffff, best, offset);
        const int other_index = __shfl_xor_sync(0xffffffff, index, offset);
        better(best, index, other, other_index, cols);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) {
        bests[warp] = best;
        indices[warp] = index;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / 32; ++w) better(best, index, bests[w], indices[w], cols);
        out[blockIdx.x] = index == cols ? 0 : index;
    }
}

#define ARGMAX_ROWS(NAME, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)                               \
        NAME(uint32_t* out, const T* x, const uint32_t* rows, int cols, int vector) {          \
        argmax_rows<T>(out, x, rows, cols, vector);                                            \
    }

ARGMAX_ROWS(argmax_rows_f32, float)
ARGMAX_ROWS(argmax_rows_bf16, __nv_bfloat16)

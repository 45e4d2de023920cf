// The argmax of each requested row: the first index of its largest value, NaN never chosen (a
// row of NaN gives 0). One block per requested row (`rows[b]` is block b's); each thread scans a stride of the row, then the threads' picks
// meet, the larger value winning and the lower index on a tie, so the result is the one a
// scan in index order finds, whatever the block size.
#include "common.cuh"

#define ARGMAX_THREADS 256

// The better of two picks: the larger value, the lower index on a tie; `cols` is no pick.
__device__ __forceinline__ void better(float& best, int& index, float other, int other_index, int cols) {
    if (other_index == cols) return;
    if (index == cols || other > best || (other == best && other_index < index)) {
        best = other;
        index = other_index;
    }
}

template <typename T>
__device__ void argmax_rows(uint32_t* out, const T* x, const uint32_t* rows, int cols) {
    __shared__ float bests[ARGMAX_THREADS / 32];
    __shared__ int indices[ARGMAX_THREADS / 32];
    const T* row = x + (size_t)rows[blockIdx.x] * cols;
    float best = -INFINITY;
    int index = cols;
    for (int c = threadIdx.x; c < cols; c += ARGMAX_THREADS) {
        const float v = to_f32(row[c]);
        if (v > best || (index == cols && v == best)) {
            best = v;
            index = c;
        }
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
        NAME(uint32_t* out, const T* x, const uint32_t* rows, int cols) {                      \
        argmax_rows<T>(out, x, rows, cols);                                                    \
    }

ARGMAX_ROWS(argmax_rows_f32, float)
ARGMAX_ROWS(argmax_rows_bf16, __nv_bfloat16)

// Rows gathered from two tables in one launch: row b of `out` is row picks[b] of `first` where
// that is one of its `first_rows` rows, else row picks[b] - first_rows of `second`. A drafter
// pass's hidden input is gathered so, from the projected target states and, for P-EAGLE's mask
// slots, the mask state, with no concatenation of the two first. One block per output row; the
// launcher checks every pick against the tables. A copy: no arithmetic, no order to keep.
#include "common.cuh"

#define GATHER_THREADS 256

template <typename T>
__device__ void gather_rows(T* out, const T* first, const T* second, const uint32_t* picks, int first_rows,
                            int cols) {
    const uint32_t pick = picks[blockIdx.x];
    const T* row = pick < (uint32_t)first_rows ? first + (size_t)pick * cols
                                               : second + (size_t)(pick - first_rows) * cols;
    T* to = out + (size_t)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += GATHER_THREADS) to[c] = row[c];
}

#define GATHER_ROWS(NAME, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(GATHER_THREADS) NAME(                         \
        T* out, const T* first, const T* second, const uint32_t* picks, int first_rows, int cols) { \
        gather_rows<T>(out, first, second, picks, first_rows, cols);                           \
    }

GATHER_ROWS(gather_rows_f32, float)
GATHER_ROWS(gather_rows_bf16, __nv_bfloat16)

// Rows gathered from two tables in one launch: row b of `out` is row picks[b] of `first` where
// that is one of its `first_rows` rows, else row picks[b] - first_rows of `second`. A drafter
// pass's hidden input is gathered so, from the projected target states and, for P-EAGLE's mask
// slots, the mask state, with no concatenation of the two first. One block per output row. A
// copy: no arithmetic, no order to keep.
//
// Every kernel here reads indices that may have been uploaded with a forward's inputs, which
// the host checks in its own copy (indices.rs) but never reads back: each skips an index past
// its tensors, so that a device copy that disagreed could not read or write out of bounds.
//
// chain_drafts feeds autoregressive drafting (EAGLE-3's passes after the first) on the device,
// so that no pass waits for the host to read the last one's drafts: row b of the next pass
// reads kept row picks[b] of the last pass, its hidden output as the hidden input and its draft
// id, mapped to the target's vocabulary by `to_target`, as its token. The first `drafts_rows`
// rows' tokens, the last pass's drafts in order, are also written to `drafts`. An id past the
// map (argmax gives none) becomes token 0 rather than a read past it.
#include "common.cuh"

#define GATHER_THREADS 256

template <typename T>
__device__ void gather_rows(T* out, const T* first, const T* second, const uint32_t* picks, int first_rows,
                            int rows, int cols) {
    const uint32_t pick = picks[blockIdx.x];
    if (pick >= (uint32_t)rows) return;
    const T* row = pick < (uint32_t)first_rows ? first + (size_t)pick * cols
                                               : second + (size_t)(pick - first_rows) * cols;
    T* to = out + (size_t)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += GATHER_THREADS) to[c] = row[c];
}

#define GATHER_ROWS(NAME, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(GATHER_THREADS) NAME(                         \
        T* out, const T* first, const T* second, const uint32_t* picks, int first_rows, int rows, int cols) { \
        gather_rows<T>(out, first, second, picks, first_rows, rows, cols);                     \
    }

GATHER_ROWS(gather_rows_f32, float)
GATHER_ROWS(gather_rows_bf16, __nv_bfloat16)

template <typename T>
__device__ void chain_drafts(T* hidden_out, uint32_t* tokens, uint32_t* drafts, const T* hidden,
                             const uint32_t* ids, const uint32_t* to_target, const uint32_t* picks,
                             int vocab, int kept, int drafts_rows, int cols) {
    const uint32_t pick = picks[blockIdx.x];
    if (pick >= (uint32_t)kept) return;
    if (threadIdx.x == 0) {
        const uint32_t id = ids[pick];
        const uint32_t token = id < (uint32_t)vocab ? to_target[id] : 0;
        tokens[blockIdx.x] = token;
        if ((int)blockIdx.x < drafts_rows) drafts[blockIdx.x] = token;
    }
    const T* row = hidden + (size_t)pick * cols;
    T* to = hidden_out + (size_t)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += GATHER_THREADS) to[c] = row[c];
}

#define CHAIN_DRAFTS(NAME, T)                                                                  \
    extern "C" __global__ void __launch_bounds__(GATHER_THREADS) NAME(                         \
        T* hidden_out, uint32_t* tokens, uint32_t* drafts, const T* hidden, const uint32_t* ids, \
        const uint32_t* to_target, const uint32_t* picks, int vocab, int kept, int drafts_rows, int cols) { \
        chain_drafts<T>(hidden_out, tokens, drafts, hidden, ids, to_target, picks, vocab, kept, drafts_rows, cols); \
    }

CHAIN_DRAFTS(chain_drafts_f32, float)
CHAIN_DRAFTS(chain_drafts_bf16, __nv_bfloat16)

// take_ids writes token ids that are already on the device where a forward reads them:
// out[at[j]] = map[ids[picks[j]]] with a map of `vocab` >= 0 entries, ids[picks[j]] where vocab
// is negative (no map; `map` is then not read); without places (`has_at` 0), place j is j. A
// proposer's drafts become target ids so (the drafter's draft-to-target table), and the next
// verification window reads them so (no map), without the host reading them first. The host
// checks that no two places are equal. An id past the map becomes 0, as in chain_drafts. One
// thread an id.
#define TAKE_THREADS 128

extern "C" __global__ void __launch_bounds__(TAKE_THREADS)
    take_ids(uint32_t* out, const uint32_t* ids, const uint32_t* map, const uint32_t* at, const uint32_t* picks,
             int has_at, int n, int vocab, int out_len, int ids_len) {
    const int j = blockIdx.x * TAKE_THREADS + threadIdx.x;
    if (j >= n) return;
    const uint32_t place = has_at ? at[j] : (uint32_t)j, pick = picks[j];
    if (place >= (uint32_t)out_len || pick >= (uint32_t)ids_len) return;
    const uint32_t id = ids[pick];
    out[place] = vocab < 0 ? id : (id < (uint32_t)vocab ? map[id] : 0);
}

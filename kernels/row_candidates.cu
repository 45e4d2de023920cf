// What the host needs to cut a sampled row's top-k / min-p / top-p nucleus without the row
// itself: the row's first `count` tokens in sampling's order, with their logits, and the sums
// of the other tokens' weights.
//
// Sampling's order: the larger logit first under f32's total order (`f32::total_cmp`), the
// lower index first on a tie. A token's weight is expf((logit - max) / temperature), max being
// the first token's logit, widened to f64; the rest's weights are summed apart by where they
// fall against the request's two thresholds `lo` <= `hi`: `above` (w >= hi) and `between`
// (lo <= w < hi). Weights below lo, and NaN, are in neither. `total`, the normaliser of the
// row's log-probabilities, sums exp((double)(logit - max)) over every token.
//
// One block of ROW_CANDIDATE_THREADS per requested row. Radix selection over the tokens' order
// keys, 8 bits a pass, finds the key of the count-th token and how many tokens at that key are
// among the first `count` (the lowest-indexed ones); a last pass gathers the first tokens and
// sums the rest. The block sorts what it gathered by rank. Each output depends on its row and
// its request alone, and its sums are reduced in a fixed order.
//
// Output per request, `2 * count + 6` words: the tokens, their logits' bits, then `above`,
// `between` and `total` as f64 bits, low word first.
#include "common.cuh"

#define ROW_CANDIDATE_THREADS 1024
#define MAX_ROW_CANDIDATES 1024

// Which of two tokens of distinct indices comes first: the composite key is larger.
__device__ __forceinline__ uint64_t rank_key(uint32_t key, uint32_t index) {
    return ((uint64_t)key << 32) | (uint64_t)(~index);
}

__device__ __forceinline__ double block_sum_f64(double v, double* scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < ROW_CANDIDATE_THREADS / 32; ++w) total += scratch[w];
    return total;
}

template <typename T>
__device__ void row_candidates(uint32_t* out, const T* logits, const uint32_t* rows, const float* temperatures,
                               const double* thresholds, int cols, int count) {
    __shared__ uint32_t histogram[256];
    __shared__ uint32_t warp_counts[ROW_CANDIDATE_THREADS / 32];
    __shared__ uint32_t gathered[MAX_ROW_CANDIDATES];
    __shared__ uint64_t gathered_keys[MAX_ROW_CANDIDATES];
    __shared__ uint32_t chosen_digit, still_needed, greater_slots, max_key;
    __shared__ double scratch[ROW_CANDIDATE_THREADS / 32];

    const int request = blockIdx.x;
    const T* row = logits + (size_t)rows[request] * cols;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

    // Radix selection: after the passes, `prefix` is the count-th token's key and `needed`
    // how many tokens at that key are among the first `count`.
    uint32_t prefix = 0, mask = 0, needed = count;
    if (tid == 0) max_key = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int d = tid; d < 256; d += ROW_CANDIDATE_THREADS) histogram[d] = 0;
        __syncthreads();
        uint32_t largest = 0;
        for (int c = tid; c < cols; c += ROW_CANDIDATE_THREADS) {
            const uint32_t key = order_key(to_f32(row[c]));
            largest = max(largest, key);
            if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & 255], 1u);
        }
        if (shift == 24) atomicMax(&max_key, largest);
        __syncthreads();
        if (tid == 0) {
            uint32_t left = needed;
            int d = 255;
            while (histogram[d] < left) left -= histogram[d--];
            chosen_digit = d;
            still_needed = left;
        }
        __syncthreads();
        prefix |= chosen_digit << shift;
        mask |= 255u << shift;
        needed = still_needed;
        __syncthreads();
    }
    const uint32_t threshold = prefix;
    const int greater = count - (int)needed;
    if (tid == 0) greater_slots = 0;
    __syncthreads();

    // The max logit, back from its key.
    const uint32_t mk = max_key;
    const float max = __uint_as_float(mk ^ ((mk & 0x80000000u) ? 0x80000000u : 0xffffffffu));
    const float temperature = temperatures[request];
    const double lo = thresholds[2 * request], hi = thresholds[2 * request + 1];

    // Gather: tokens above the threshold key in any slot before `greater`, those at it in
    // index order after them until `needed` are taken; every other token's weight is summed.
    double above = 0.0, between = 0.0, total = 0.0;
    uint32_t ties_taken = 0;
    for (int base = 0; base < cols; base += ROW_CANDIDATE_THREADS) {
        const int c = base + tid;
        const float logit = c < cols ? to_f32(row[c]) : 0.f;
        const uint32_t key = order_key(logit);
        const bool tie = c < cols && key == threshold;
        const uint32_t ballot = __ballot_sync(0xffffffff, tie);
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        uint32_t tie_rank = ties_taken + __popc(ballot & ((1u << lane) - 1));
        uint32_t tile_ties = 0;
        for (int w = 0; w < ROW_CANDIDATE_THREADS / 32; ++w) {
            if (w < warp) tie_rank += warp_counts[w];
            tile_ties += warp_counts[w];
        }
        __syncthreads();
        ties_taken += tile_ties;
        if (c >= cols) continue;
        total += exp((double)(logit - max));
        const bool first = key > threshold || (tie && tie_rank < needed);
        if (first) {
            const uint32_t slot = key > threshold ? atomicAdd(&greater_slots, 1u) : greater + tie_rank;
            gathered[slot] = c;
            gathered_keys[slot] = rank_key(key, c);
        } else {
            const double w = (double)expf((logit - max) / temperature);
            above += w >= hi ? w : 0.0;
            between += (w >= lo && w < hi) ? w : 0.0;
        }
    }
    above = block_sum_f64(above, scratch);
    between = block_sum_f64(between, scratch);
    total = block_sum_f64(total, scratch);

    // Each gathered token goes to its rank among them.
    uint32_t* tokens = out + (size_t)request * (2 * count + 6);
    uint32_t* logit_bits = tokens + count;
    for (int i = tid; i < count; i += ROW_CANDIDATE_THREADS) {
        const uint64_t mine = gathered_keys[i];
        int rank = 0;
        for (int j = 0; j < count; ++j) rank += gathered_keys[j] > mine;
        tokens[rank] = gathered[i];
        logit_bits[rank] = __float_as_uint(to_f32(row[gathered[i]]));
    }
    if (tid < 3) {
        const double sum = tid == 0 ? above : tid == 1 ? between : total;
        const unsigned long long bits = __double_as_longlong(sum);
        logit_bits[count + 2 * tid] = (uint32_t)bits;
        logit_bits[count + 2 * tid + 1] = (uint32_t)(bits >> 32);
    }
}

#define ROW_CANDIDATES(NAME, T)                                                                             \
    extern "C" __global__ void __launch_bounds__(ROW_CANDIDATE_THREADS)                                     \
        NAME(uint32_t* out, const T* logits, const uint32_t* rows, const float* temperatures,               \
             const double* thresholds, int cols, int count) {                                               \
        row_candidates<T>(out, logits, rows, temperatures, thresholds, cols, count);                        \
    }

ROW_CANDIDATES(row_candidates_f32, float)
ROW_CANDIDATES(row_candidates_bf16, __nv_bfloat16)

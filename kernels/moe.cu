// A mixture-of-experts block on the device, from the router's logits to the block's output:
// the launches that serve every kind of expert weight, around the projections of its kind.
//   moe_route_group  each row's top-k experts and routing weights, then the (row, rank) pairs
//                    grouped by expert, and tiles of up to `tile` pairs of one expert (the
//                    launcher's choice: MOE_TILE, or MOE_WIDE_TILE for the wide tensor-core
//                    projections);
//   the projections  per tile, the gate and up projections with their biases and the (clamped)
//                    SwiGLU, activations [pairs, I] in f32; then the down projection with its
//                    bias, [pairs, H] in f32: moe_mxfp4.cu (CUDA cores) and moe_mxfp4_mma.cu
//                    (tensor cores) for gpt-oss's MXFP4 experts, moe_dense.cu for bf16 or FP8;
//   moe_combine      each row's experts' outputs weighted, in rank order; in a model, the next
//                    block's input norm does this as it adds them to the residual stream instead
//                    (rms_norm.cu's experts_add_rms_norm_*), the final norm too; it serves the
//                    experts' `forward`, which sums them.
#include "common.cuh"

#define MOE_MAX_EXPERTS 1024

// ---- routing ---------------------------------------------------------------------------------

// Row `row`'s routing, by one warp: k rounds of a warp argmax over the experts not yet chosen,
// in the CPU sort's order (total_cmp, ties to the lower index: with NaN or signed zeros too,
// every lane agrees on the pick), then the weights: each chosen expert's exp(s - max) over the
// sum of the k chosen (normalize) or of all experts. Lane l owns experts l, l + 32, ...;
// k <= experts.
template <typename T>
__device__ void route_row(const T* logits, int row, int experts, int k, int normalize, int* ids, float* weights) {
    const int lane = threadIdx.x % 32;
    const T* s = logits + (size_t)row * experts;
    uint32_t taken = 0;  // bit j: expert lane + 32 j chosen
    float best_score = 0.f, sum = 0.f;
    for (int rank = 0; rank < k; ++rank) {
        uint32_t key = 0;
        int index = experts;  // no pick
        for (int j = 0, e = lane; e < experts; ++j, e += 32) {
            const uint32_t x = order_key(to_f32(s[e]));
            if (!(taken >> j & 1) && (index == experts || x > key)) {
                key = x;
                index = e;
            }
        }
        for (int offset = 16; offset > 0; offset /= 2) {
            const uint32_t other = __shfl_xor_sync(0xffffffff, key, offset);
            const int other_index = __shfl_xor_sync(0xffffffff, index, offset);
            const bool better = other > key || (other == key && other_index < index);
            if (other_index != experts && (index == experts || better)) {
                key = other;
                index = other_index;
            }
        }
        const float score = to_f32(s[index]);
        if (index % 32 == lane) taken |= 1u << (index / 32);
        if (rank == 0) best_score = score;
        const float x = expf(score - best_score);
        if (lane == 0) {
            ids[row * k + rank] = index;
            weights[row * k + rank] = x;
        }
        sum += x;
    }
    if (!normalize) {
        float all = 0.f;
        for (int e = lane; e < experts; e += 32) all += expf(to_f32(s[e]) - best_score);
        sum = warp_sum(all);
    }
    __syncwarp();
    if (lane == 0)
        for (int rank = 0; rank < k; ++rank) weights[row * k + rank] /= sum;
}

// The pairs grouped by expert, by one block of whole warps: `pair_rows[p]` is the row of sorted
// pair p and `pair_of[row * k + rank]` its index, each expert's pairs in (row, rank) order.
// Tiles list each expert's pairs `tile` at a time: `tiles[3 t ..]` = (expert, first pair,
// pairs); `num_tiles[0]` says how many there are. Warp w takes experts w, w + warps, ...; its
// lanes look at 32 pairs at a time, and a ballot counts the expert's among them, then places
// each at the count of those before it. Warp 0 sums the counts (and the tiles they make) by
// warp scans, 32 experts at a time.
__device__ void group_pairs(const int* ids, int pairs, int experts, int* pair_rows, int* pair_of, int* tiles,
                            int* num_tiles, int k, int tile) {
    __shared__ int counts[MOE_MAX_EXPERTS], offsets[MOE_MAX_EXPERTS], first_tiles[MOE_MAX_EXPERTS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int e = warp; e < experts; e += warps) {
        int n = 0;
        for (int i = lane; i - lane < pairs; i += 32) n += __popc(__ballot_sync(0xffffffffu, i < pairs && ids[i] == e));
        if (lane == 0) counts[e] = n;
    }
    __syncthreads();
    if (warp == 0) {
        int pairs_before = 0, tiles_before = 0;
        for (int e = lane; e - lane < experts; e += 32) {
            const int n = e < experts ? counts[e] : 0, t = (n + tile - 1) / tile;
            int n_through = n, t_through = t;
            for (int d = 1; d < 32; d *= 2) {
                const int n_below = __shfl_up_sync(0xffffffffu, n_through, d);
                const int t_below = __shfl_up_sync(0xffffffffu, t_through, d);
                if (lane >= d) {
                    n_through += n_below;
                    t_through += t_below;
                }
            }
            if (e < experts) {
                offsets[e] = pairs_before + n_through - n;
                first_tiles[e] = tiles_before + t_through - t;
            }
            pairs_before += __shfl_sync(0xffffffffu, n_through, 31);
            tiles_before += __shfl_sync(0xffffffffu, t_through, 31);
        }
        if (lane == 0) num_tiles[0] = tiles_before;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < experts; e += blockDim.x)
        for (int first = 0, t = first_tiles[e]; first < counts[e]; first += tile, ++t) {
            tiles[3 * t] = e;
            tiles[3 * t + 1] = offsets[e] + first;
            tiles[3 * t + 2] = min(tile, counts[e] - first);
        }
    for (int e = warp; e < experts; e += warps) {
        int next = offsets[e];
        for (int i = lane; i - lane < pairs; i += 32) {
            const bool mine = i < pairs && ids[i] == e;
            const uint32_t ballot = __ballot_sync(0xffffffffu, mine);
            if (mine) {
                const int p = next + __popc(ballot & ((1u << lane) - 1));
                pair_rows[p] = i / k;
                pair_of[i] = p;
            }
            next += __popc(ballot);
        }
    }
}

// Routing and grouping in one launch of one block of MOE_ROUTE_THREADS: its warps route rows
// warp, warp + 32, ... (`route_row`), then, once every row's experts are written (a barrier
// makes a block's global writes visible to the whole block), it groups the pairs
// (`group_pairs`), a warp an expert. A decode step's few rows would leave a launch of their
// own mostly waiting. A launch is one block, which the bound says: without it ptxas holds
// sm_100 to 32 registers and spills.
#define MOE_ROUTE_THREADS MOE_MAX_EXPERTS

template <typename T>
__device__ void moe_route_group(const T* logits, int rows, int experts, int k, int normalize, int* ids,
                                float* weights, int* pair_rows, int* pair_of, int* tiles, int* num_tiles, int tile) {
    for (int row = threadIdx.x / 32; row < rows; row += blockDim.x / 32)
        route_row(logits, row, experts, k, normalize, ids, weights);
    __syncthreads();
    group_pairs(ids, rows * k, experts, pair_rows, pair_of, tiles, num_tiles, k, tile);
}

#define MOE_ROUTE_GROUP(NAME, T)                                                               \
    extern "C" __global__ void __launch_bounds__(MOE_ROUTE_THREADS, 1)                         \
        NAME(const T* logits, int rows, int experts, int k, int normalize, int* ids, float* weights, \
             int* pair_rows, int* pair_of, int* tiles, int* num_tiles, int tile) {              \
        moe_route_group<T>(logits, rows, experts, k, normalize, ids, weights, pair_rows, pair_of, tiles, \
                           num_tiles, tile);                                                    \
    }

MOE_ROUTE_GROUP(moe_route_group_f32, float)
MOE_ROUTE_GROUP(moe_route_group_bf16, __nv_bfloat16)

// ---- combine -----------------------------------------------------------------------------------

// out[row] = the sum over ranks, in rank order, of weight * the expert's output, each product
// rounded before its addition as the CPU does. A row's columns are dealt to gridDim.y blocks.
template <typename T>
__device__ void moe_combine(T* out, const float* y, const float* weights, const int* pair_of, int hidden, int k) {
    const int row = blockIdx.x;
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < hidden; c += gridDim.y * blockDim.x) {
        float o = 0.f;
        for (int rank = 0; rank < k; ++rank) {
            const int p = pair_of[row * k + rank];
            o = __fadd_rn(o, __fmul_rn(weights[row * k + rank], y[(size_t)p * hidden + c]));
        }
        out[(size_t)row * hidden + c] = from_f32<T>(o);
    }
}

#define MOE_COMBINE(NAME, T)                                                                   \
    extern "C" __global__ void NAME(T* out, const float* y, const float* weights, const int* pair_of, \
                                    int hidden, int k) {                                       \
        moe_combine<T>(out, y, weights, pair_of, hidden, k);                                   \
    }

MOE_COMBINE(moe_combine_f32, float)
MOE_COMBINE(moe_combine_bf16, __nv_bfloat16)

// Structured output's bans where the logits lie: each row of `x` [rows, vocab] keeps the values
// its bits `allowed` [rows, words] allow (bit t % 32 of word t / 32 allows token t) and takes -inf
// for the others, written to `out`. A row's bits cross to the device, vocab / 8 bytes, where its
// banned tokens and their values would be up to twice the row.
#include "common.cuh"

extern "C" __global__ void mask_tokens_f32(float* out, const float* x, const unsigned int* allowed, int rows,
                                           int vocab, int words) {
    const size_t total = (size_t)rows * vocab;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / vocab;
        const unsigned int token = (unsigned int)(i % vocab);
        const bool kept = (allowed[row * words + token / 32] >> (token % 32)) & 1u;
        out[i] = kept ? x[i] : -INFINITY;
    }
}

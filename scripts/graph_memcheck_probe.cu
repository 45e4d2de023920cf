// Does compute-sanitizer's memcheck misread a correct CUDA graph whose later allocations take
// the addresses of earlier ones freed inside the same graph?
//
// peagle's graphs drew memcheck reports (writes "after the nearest allocation of 512 bytes",
// reads "out of bounds ... inside the nearest allocation") from kernels that run clean without
// a graph, and their outputs equal the eager ones bit for bit. This program captures the
// pattern of a forward and nothing else: a chain of STEPS intermediates of varied sizes, each
// allocated, written whole by a kernel that reads the one before it whole, after which the one
// before is freed, as candle allocates and drops tensors in a captured forward; the last is
// kept as the graph's output. The graph is instantiated to free its outputs on each launch, as
// peagle's graphs were until they freed all they allocate, launched three times, and its output
// then read by a kernel outside it, as the LM head read a replay's states. Every access is in
// bounds by construction.
//
// It prints whether any allocation took an address inside one freed before it (reuse, the
// case in question), over how many intermediates the output lies (which the next launch
// writes while the last launch's output is still allocated, until that launch frees it), and
// whether the output holds the chain's value, and exits 0 when it does. Run alone it must
// pass; under `compute-sanitizer --tool memcheck`, errors with reuse mean memcheck misreads
// graph memory reuse, and none with reuse mean it reads it right, so peagle's reports would be
// real; the same for an output over intermediates and memcheck's reading of a launch freeing
// the last one's output. scripts/gpu_check.sh runs it both ways.
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(call)                                                                             \
    do {                                                                                        \
        cudaError_t err = (call);                                                               \
        if (err != cudaSuccess) {                                                               \
            std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(err));            \
            return 2;                                                                           \
        }                                                                                       \
    } while (0)

#define STEPS 24

// out[i] = 1 + the mean of `in` (n_in values, summed in order; 1 without any): every value of
// `in` read, every one of `out` written.
__device__ __host__ float next_of(const float* in, int n_in) {
    float sum = 0.f;
    for (int j = 0; j < n_in; ++j) sum += in[j];
    return n_in ? 1.f + sum / n_in : 1.f;
}

__global__ void next_value(float* out, int n_out, const float* in, int n_in) {
    const float value = next_of(in, n_in);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_out; i += gridDim.x * blockDim.x) out[i] = value;
}

// The float count of intermediate `step`: 128 to 1536 values (512 bytes to 6 KiB), varied so
// that a freed pair of small ones can hold a later large one.
static int size_of(int step) {
    const int sizes[] = {128, 384, 128, 128, 1536, 256, 128, 768};
    return sizes[step % 8];
}

int main() {
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    float* buffers[STEPS] = {};
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int step = 0; step < STEPS; ++step) {
        CHECK(cudaMallocAsync(reinterpret_cast<void**>(&buffers[step]), size_of(step) * sizeof(float), stream));
        const float* in = step ? buffers[step - 1] : nullptr;
        next_value<<<2, 128, 0, stream>>>(buffers[step], size_of(step), in, step ? size_of(step - 1) : 0);
        if (step) CHECK(cudaFreeAsync(buffers[step - 1], stream));
    }
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    for (int launch = 0; launch < 3; ++launch) CHECK(cudaGraphLaunch(exec, stream));
    // The output read by a kernel outside the graph.
    const int last = STEPS - 1;
    float* check = nullptr;
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&check), sizeof(float), stream));
    next_value<<<1, 1, 0, stream>>>(check, 1, buffers[last], size_of(last));
    CHECK(cudaStreamSynchronize(stream));

    // The chain's values on the host, by the kernel's arithmetic.
    float chain[1536], value = 0.f;
    for (int step = 0; step < STEPS; ++step) {
        for (int j = 0; step && j < size_of(step - 1); ++j) chain[j] = value;
        value = next_of(chain, step ? size_of(step - 1) : 0);
    }
    float out[1536], checked = 0.f;
    CHECK(cudaMemcpy(out, buffers[last], size_of(last) * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(&checked, check, sizeof(float), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (int i = 0; i < size_of(last); ++i) wrong += out[i] != value;
    for (int j = 0; j < size_of(last); ++j) chain[j] = value;
    wrong += checked != next_of(chain, size_of(last));

    // Reuse: an allocation starting inside the range of one freed before it was made.
    int reused = 0;
    for (int step = 2; step < STEPS; ++step)
        for (int earlier = 0; earlier + 1 < step; ++earlier) {
            const uintptr_t start = reinterpret_cast<uintptr_t>(buffers[earlier]);
            const uintptr_t at = reinterpret_cast<uintptr_t>(buffers[step]);
            if (at >= start && at < start + size_of(earlier) * sizeof(float)) {
                ++reused;
                break;
            }
        }
    // The output over an intermediate: each launch then writes that intermediate where the
    // launch before left its output, freed only by this launch (AUTO_FREE_ON_LAUNCH), as a
    // replay of peagle's graphs wrote where the last replay's states lay.
    int covered = 0;
    const uintptr_t out_start = reinterpret_cast<uintptr_t>(buffers[last]);
    const uintptr_t out_end = out_start + size_of(last) * sizeof(float);
    for (int step = 0; step < last; ++step) {
        const uintptr_t start = reinterpret_cast<uintptr_t>(buffers[step]);
        covered += start < out_end && out_start < start + size_of(step) * sizeof(float);
    }
    std::printf("graph memcheck probe: %d of %d allocations took a freed one's address (%s); the output lies over "
                "%d intermediate(s); %d values wrong\n",
                reused, STEPS, reused ? "reuse" : "no reuse", covered, wrong);
    CHECK(cudaFreeAsync(check, stream));
    CHECK(cudaFreeAsync(buffers[last], stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(stream));
    return wrong == 0 ? 0 : 1;
}

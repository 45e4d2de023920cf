// Does compute-sanitizer's memcheck misread a correct CUDA graph whose later allocation takes
// the address of an earlier, smaller one freed inside the same graph?
//
// peagle's graphs draw memcheck reports (writes "after the nearest allocation of 512 bytes",
// reads "out of bounds ... inside the nearest allocation") from kernels that run clean without
// a graph, and their outputs equal the eager ones bit for bit. This program captures that
// pattern and nothing else: A (512 bytes) is allocated, written and freed; B (1536 bytes) is
// then allocated, written whole and kept as the graph's output, as candle's allocations are in
// a captured forward; the graph is instantiated to free its outputs on each launch, as
// `cuda_graphs.rs` does, and launched three times. Every access is in bounds by construction.
//
// It prints whether B took A's address and whether B holds what was written, and exits 0 when
// it does. Run alone it must pass; under `compute-sanitizer --tool memcheck`, errors reported
// with B at A's address mean memcheck misreads graph memory reuse, and none mean it reads it
// right, so peagle's reports would be real. scripts/gpu_check.sh runs it both ways.
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

__global__ void fill(float* p, int n, float value) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = value;
}

int main() {
    const int small = 128, large = 384;  // 512 and 1536 bytes of f32
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    float *a = nullptr, *b = nullptr;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&a), small * sizeof(float), stream));
    fill<<<1, 128, 0, stream>>>(a, small, 1.f);
    CHECK(cudaFreeAsync(a, stream));
    CHECK(cudaMallocAsync(reinterpret_cast<void**>(&b), large * sizeof(float), stream));
    fill<<<(large + 127) / 128, 128, 0, stream>>>(b, large, 2.f);
    cudaGraph_t graph;
    CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch));
    for (int launch = 0; launch < 3; ++launch) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    float host[large];
    CHECK(cudaMemcpy(host, b, sizeof(host), cudaMemcpyDeviceToHost));
    int wrong = 0;
    for (float v : host) wrong += v != 2.f;
    std::printf("graph memcheck probe: A at %p, B at %p (%s); %d of %d values of B wrong\n",
                static_cast<void*>(a), static_cast<void*>(b), a == b ? "B took A's address" : "apart",
                wrong, large);
    CHECK(cudaFreeAsync(b, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(stream));
    return wrong == 0 ? 0 : 1;
}

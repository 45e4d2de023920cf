// The emulator's own tests, through the driver API as a binary calls it: warp collectives
// against their definitions, mma against a plain matrix product, graph capture and what it
// refuses, a graph's memory by CUDA's rules, and the reports of a fault, of a use of a graph's
// freed memory and of a deadlock, which end a child process. Run by
// scripts/build_cuda_emulator.sh after each build; exits non-zero on the first failure.
#include "device.h"
#include "launch.h"

#include <cuda.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

extern "C" __global__ void shuffles(int* out) {
    const int lane = threadIdx.x % 32, v = 100 + lane;
    out[4 * threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 5);
    out[4 * threadIdx.x + 1] = __shfl_down_sync(0xffffffffu, v, 3, 16);
    out[4 * threadIdx.x + 2] = __shfl_sync(0xffffffffu, v, 7);
    out[4 * threadIdx.x + 3] = static_cast<int>(__ballot_sync(0xffffffffu, lane % 3 == 0));
}

// emu::butterfly against the five shuffles it stands for, under an operation that is neither
// commutative nor associative, so that only the same operands in the same order agree.
extern "C" __global__ void butterflies(unsigned* out) {
    const auto op = [](unsigned a, unsigned b) { return a * 31u + b; };
    unsigned v = 7u * threadIdx.x + 1u;
    const unsigned fast = emu::butterfly(v, op);
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    out[2 * threadIdx.x] = fast;
    out[2 * threadIdx.x + 1] = v;
}

// Each thread writes its index to shared memory, then reads its mirror's after the barrier.
extern "C" __global__ void mirror(int* out) {
    __shared__ int slots[1024];
    slots[threadIdx.x] = static_cast<int>(threadIdx.x);
    __syncthreads();
    out[threadIdx.x] = slots[blockDim.x - 1 - threadIdx.x] + 1000 * static_cast<int>(blockIdx.x);
}

// One m16n8k16 product of a [16][16] and b [16][8] (bf16) into d [16][8], by the fragment
// layout of kernels/mma.cuh.
extern "C" __global__ void mma_tile(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    auto pair = [](const __nv_bfloat16* p, int step) {
        uint16_t lo, hi;
        std::memcpy(&lo, p, 2);
        std::memcpy(&hi, p + step, 2);
        return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
    };
    const uint32_t frag_a[4] = {pair(a + g * 16 + 2 * t, 1), pair(a + (g + 8) * 16 + 2 * t, 1),
                                pair(a + g * 16 + 2 * t + 8, 1), pair(a + (g + 8) * 16 + 2 * t + 8, 1)};
    const uint32_t frag_b[2] = {pair(b + (2 * t) * 8 + g, 8), pair(b + (2 * t + 8) * 8 + g, 8)};
    float acc[4] = {1.f, 1.f, 1.f, 1.f};
    emu::mma_m16n8k16_bf16(acc, frag_a, frag_b);
    d[g * 8 + 2 * t] = acc[0];
    d[g * 8 + 2 * t + 1] = acc[1];
    d[(g + 8) * 8 + 2 * t] = acc[2];
    d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

extern "C" __global__ void add_one(int* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1;
}

extern "C" __global__ void write_past(int* x, int n) { x[n + 1024 + threadIdx.x] = 1; }

// Thread 0 waits for its warp at a shuffle while the others wait at a barrier: neither can
// pass. (A thread that returns is not waited for, as on a GPU since Volta.)
extern "C" __global__ void diverged_barrier(int* x) {
    if (threadIdx.x == 0)
        x[0] = __shfl_sync(0xffffffffu, 1, 0);
    else
        __syncthreads();
}

#define EMU_SOURCE "self_test/self_test"
EMU_REGISTER(shuffles)
EMU_REGISTER(butterflies)
EMU_REGISTER(mirror)
EMU_REGISTER(mma_tile)
EMU_REGISTER(add_one)
EMU_REGISTER(write_past)
EMU_REGISTER(diverged_barrier)

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
    if (!ok) {
        std::fprintf(stderr, "self test FAILED: %s\n", what.c_str());
        ++failures;
    }
}

CUfunction kernel(const char* name) {
    static CUmodule module = [] {
        CUmodule m;
        cuModuleLoadData(&m, ".entry shuffles(\n.entry butterflies(\n.entry mirror(\n.entry mma_tile(\n.entry add_one(\n"
                             ".entry write_past(\n.entry diverged_barrier(\n");
        return m;
    }();
    CUfunction f = nullptr;
    check(cuModuleGetFunction(&f, module, name) == CUDA_SUCCESS, std::string("finding ") + name);
    return f;
}

template <typename T> CUdeviceptr device(const std::vector<T>& host) {
    CUdeviceptr p;
    cuMemAlloc_v2(&p, host.size() * sizeof(T));
    cuMemcpyHtoD_v2(p, host.data(), host.size() * sizeof(T));
    return p;
}

template <typename T> std::vector<T> read(CUdeviceptr p, size_t n) {
    std::vector<T> host(n);
    cuMemcpyDtoH_v2(host.data(), p, n * sizeof(T));
    return host;
}

CUresult launch(const char* name, unsigned grid, unsigned threads, std::vector<void*> args, CUstream stream = nullptr) {
    return cuLaunchKernel(kernel(name), grid, 1, 1, threads, 1, 1, 0, stream, args.data(), nullptr);
}

void collectives() {
    CUdeviceptr out = device(std::vector<int>(64 * 4));
    launch("shuffles", 1, 64, {&out});
    const auto got = read<int>(out, 64 * 4);
    unsigned ballot = 0;
    for (int lane = 0; lane < 32; lane += 3) ballot |= 1u << lane;
    for (int tid = 0; tid < 64; ++tid) {
        const int lane = tid % 32, segment = lane - lane % 16;
        const int down = lane + 3 < segment + 16 ? 100 + lane + 3 : 100 + lane;
        check(got[4 * tid] == 100 + (lane ^ 5), "__shfl_xor_sync, thread " + std::to_string(tid));
        check(got[4 * tid + 1] == down, "__shfl_down_sync of width 16, thread " + std::to_string(tid));
        check(got[4 * tid + 2] == 107, "__shfl_sync, thread " + std::to_string(tid));
        check(static_cast<unsigned>(got[4 * tid + 3]) == ballot, "__ballot_sync, thread " + std::to_string(tid));
    }
    CUdeviceptr butterfly = device(std::vector<unsigned>(64 * 2));
    launch("butterflies", 1, 64, {&butterfly});
    const auto b = read<unsigned>(butterfly, 64 * 2);
    for (int tid = 0; tid < 64; ++tid)
        check(b[2 * tid] == b[2 * tid + 1], "emu::butterfly against five shuffles, thread " + std::to_string(tid));
    CUdeviceptr mirrored = device(std::vector<int>(3 * 96));
    launch("mirror", 1, 96, {&mirrored});
    const auto m = read<int>(mirrored, 96);
    for (int i = 0; i < 96; ++i) check(m[i] == 95 - i, "__syncthreads and __shared__, thread " + std::to_string(i));
}

void tensor_core() {
    std::vector<__nv_bfloat16> a(16 * 16), b(16 * 8);
    for (int i = 0; i < 256; ++i) a[i] = __float2bfloat16(static_cast<float>(i % 7 - 3));
    for (int i = 0; i < 128; ++i) b[i] = __float2bfloat16(static_cast<float>(i % 5) * 0.5f);
    CUdeviceptr d = device(std::vector<float>(128)), da = device(a), db = device(b);
    launch("mma_tile", 1, 32, {&d, &da, &db});
    const auto got = read<float>(d, 128);
    for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 8; ++c) {
            float want = 1.f;
            for (int k = 0; k < 16; ++k) want += __bfloat162float(a[r * 16 + k]) * __bfloat162float(b[k * 8 + c]);
            check(got[r * 8 + c] == want, "mma element (" + std::to_string(r) + ", " + std::to_string(c) + ")");
        }
}

void graphs() {
    const int n = 300;
    CUdeviceptr x = device(std::vector<int>(n, 5));
    CUstream stream;
    cuStreamCreate(&stream, 0);
    int n_arg = n;
    check(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS, "beginning a capture");
    check(launch("add_one", 3, 128, {&x, &n_arg}, stream) == CUDA_SUCCESS, "a launch in a capture");
    CUgraph graph;
    check(cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS, "ending a capture");
    check(read<int>(x, n)[0] == 5, "a captured launch runs only when the graph does");
    CUgraphExec exec;
    cuGraphInstantiateWithFlags(&exec, graph, 0);
    cuGraphLaunch(exec, stream);
    cuGraphLaunch(exec, stream);
    const auto got = read<int>(x, n);
    check(got[0] == 7 && got[n - 1] == 7, "two graph launches add two");
    cuGraphExecDestroy(exec);
    cuGraphDestroy(graph);

    std::vector<int> host(n);
    cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    check(cuMemcpyHtoDAsync_v2(x, host.data(), 4, stream) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
          "a copy from the host in a capture is refused");
    check(cuStreamEndCapture(stream, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
          "a capture that was refused something ends invalidated");
}

// A graph that allocates `kept` and `scratch`, zeroes both, adds one to each, and frees
// `scratch`, on `stream`, instantiated with `flags`.
struct AllocatingGraph {
    CUdeviceptr kept, scratch;
    CUgraphExec exec;
};

AllocatingGraph allocating_graph(CUstream stream, unsigned long long flags) {
    static int n = 100;
    AllocatingGraph g{};
    cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    for (CUdeviceptr* p : {&g.kept, &g.scratch}) {
        check(cuMemAllocAsync(p, 4 * n, stream) == CUDA_SUCCESS, "an allocation in a capture");
        cuMemsetD8Async(*p, 0, 4 * n, stream);
        launch("add_one", 1, 128, {p, &n}, stream);
    }
    check(cuMemFreeAsync(g.scratch, stream) == CUDA_SUCCESS, "a capture frees what it allocated");
    CUgraph graph;
    check(cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS, "ending a capture that allocates");
    cuGraphInstantiateWithFlags(&g.exec, graph, flags);
    return g;
}

void graph_memory() {
    CUstream stream;
    cuStreamCreate(&stream, 0);
    const auto auto_free = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
    AllocatingGraph g = allocating_graph(stream, auto_free);
    check(cuGraphLaunch(g.exec, stream) == CUDA_SUCCESS, "a graph's first launch");
    check(read<int>(g.kept, 100) == std::vector<int>(100, 1), "a graph's allocation outlives its launch");
    std::vector<int> sevens(100, 7);
    cuMemcpyHtoD_v2(g.kept, sevens.data(), 400);
    check(cuGraphLaunch(g.exec, stream) == CUDA_SUCCESS, "an auto-freeing graph launched while it holds memory");
    check(read<int>(g.kept, 100) == std::vector<int>(100, 1),
          "a launch allocates anew what the last one left: the host's sevens are gone");
    check(cuMemFreeAsync(g.scratch, stream) == CUDA_ERROR_INVALID_VALUE,
          "what a graph frees itself cannot be freed outside it");
    check(cuMemFreeAsync(g.kept, stream) == CUDA_SUCCESS, "a graph's allocation freed after its launch");
    check(cuMemFreeAsync(g.kept, stream) == CUDA_ERROR_INVALID_VALUE, "a graph's allocation freed twice");
    check(cuGraphLaunch(g.exec, stream) == CUDA_SUCCESS, "a graph launched after its allocations were freed");

    CUdeviceptr fresh, untouched;
    cuMemAlloc_v2(&fresh, 8);
    check(read<int>(fresh, 2) == std::vector<int>(2, -1), "new memory starts with every byte 0xFF");
    cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    cuMemAllocAsync(&untouched, 8, stream);
    CUgraph graph;
    cuStreamEndCapture(stream, &graph);
    CUgraphExec exec;
    cuGraphInstantiateWithFlags(&exec, graph, auto_free);
    cuGraphLaunch(exec, stream);
    check(read<int>(untouched, 2) == std::vector<int>(2, -1), "a graph's allocation starts with every byte 0xFF");

    AllocatingGraph held = allocating_graph(stream, 0);
    check(cuGraphLaunch(held.exec, stream) == CUDA_SUCCESS, "a graph that does not free on launch, launched");
    check(cuGraphLaunch(held.exec, stream) == CUDA_ERROR_INVALID_VALUE,
          "a graph that does not free on launch, launched again while it holds memory, is refused");

    CUdeviceptr outside = device(std::vector<int>(4));
    cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    check(cuMemFreeAsync(outside, stream) == CUDA_ERROR_INVALID_VALUE,
          "a capture may not free what it did not allocate");
    check(cuStreamEndCapture(stream, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
          "a capture that frees what it did not allocate ends invalidated");
    check(read<int>(outside, 4) == std::vector<int>(4, 0), "a free a capture refused frees nothing");
}

// Runs `body` in a child process: its exit status and what it wrote to stderr.
std::pair<int, std::string> in_child(void (*body)()) {
    int fds[2];
    if (pipe(fds) != 0) std::abort();
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        body();
        _exit(0);
    }
    close(fds[1]);
    std::string err;
    char buf[512];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(n));
    int status = 0;
    waitpid(pid, &status, 0);
    return {status, err};
}

void reports() {
    auto [status, err] = in_child([] {
        CUdeviceptr x = device(std::vector<int>(100));
        int n = 100;
        launch("write_past", 1, 32, {&x, &n});
    });
    check(status != 0 && err.find("invalid access") != std::string::npos &&
              err.find("kernel write_past, block (0, 0, 0), thread (0, 0, 0)") != std::string::npos &&
              err.find("past the end of an allocation of 400 bytes") != std::string::npos,
          "a write past an allocation is reported: " + err);
    std::tie(status, err) = in_child([] {
        CUdeviceptr x = device(std::vector<int>(100));
        cuMemFree_v2(x);
        int n = 100;
        launch("add_one", 1, 128, {&x, &n});
    });
    check(status != 0 && err.find("kernel add_one") != std::string::npos &&
              err.find("byte 0 of an allocation of 400 bytes, which was freed") != std::string::npos,
          "a kernel's use of freed memory is reported: " + err);
    std::tie(status, err) = in_child([] {
        CUstream stream;
        cuStreamCreate(&stream, 0);
        AllocatingGraph g = allocating_graph(stream, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        cuGraphLaunch(g.exec, stream);
        int n = 100;
        launch("add_one", 1, 128, {&g.scratch, &n});
    });
    check(status != 0 && err.find("invalid access") != std::string::npos &&
              err.find("kernel add_one") != std::string::npos &&
              err.find("byte 0 of an allocation of 400 bytes that a CUDA graph holds no memory for now") !=
                  std::string::npos,
          "a kernel's use of memory its graph freed is reported: " + err);
    std::tie(status, err) = in_child([] {
        CUstream stream;
        cuStreamCreate(&stream, 0);
        AllocatingGraph g = allocating_graph(stream, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        read<int>(g.kept, 100);
    });
    check(status != 0 && err.find("by a copy to the host of 400 bytes") != std::string::npos,
          "a copy from a graph's allocation before its graph's first launch is reported: " + err);
    std::tie(status, err) = in_child([] {
        CUdeviceptr x = device(std::vector<int>(64));
        launch("diverged_barrier", 1, 64, {&x});
    });
    check(status != 0 && err.find("deadlock at __syncthreads") != std::string::npos &&
              err.find("kernel diverged_barrier") != std::string::npos,
          "a barrier a thread never reaches is reported: " + err);
}

}  // namespace

int main() {
    cuInit(0);
    collectives();
    tensor_core();
    graphs();
    graph_memory();
    reports();
    if (failures) return 1;
    std::printf("CUDA emulator self test: ok\n");
    return 0;
}

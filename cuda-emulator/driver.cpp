// libcuda's driver API on the host: what cudarc and candle call, over the emulator's memory
// (memory.cpp) and kernels (fibers.cpp). One device; every stream runs its work as it is
// issued, in issue order, so an asynchronous call has finished when it returns. A stream under
// capture records its launches, copies, sets, allocations and frees into a graph instead, as
// CUDA's does, and refuses what CUDA refuses there (a copy to or from the host, a
// synchronization, a free of memory the capture did not allocate).
#include "launch.h"
#include "memory.h"

#include <cuda.h>
#include <signal.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace {

std::recursive_mutex driver_lock;
using Guard = std::lock_guard<std::recursive_mutex>;

struct Launch {
    const emu::KernelInfo* kernel;
    emu::Dim grid, block;
    std::vector<std::vector<char>> args;
};
struct Copy {
    CUdeviceptr dst, src;
    size_t bytes;
};
struct Set {
    CUdeviceptr dst;
    unsigned char value;
    size_t bytes;
};
// A graph's allocation and free nodes: a launch allocates the memory at the address the capture
// gave it, with contents undefined, and frees it again.
struct Alloc {
    CUdeviceptr p;
};
struct Free {
    CUdeviceptr p;
};
using Node = std::variant<Launch, Copy, Set, Alloc, Free>;

// CUDA's rules for a graph's memory, which the emulator enforces: an allocation keeps its
// address for the graph's life, and holds memory only from its allocation node in a launch to
// its free (a node of the graph, or a free after the launch); outside that, it is barred
// (memory.h), so that any use of it faults. One the graph frees itself may be freed nowhere
// else. A launch finds every allocation free, or frees what the last launch left where the
// graph was instantiated to (CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH); otherwise it is
// refused.
struct Graph {
    std::vector<Node> nodes;
    // What the capture allocated: mapped until the graph is destroyed.
    std::set<CUdeviceptr> allocations;
    // Those of them that the graph frees itself.
    std::set<CUdeviceptr> freed_inside;
    bool auto_free = false;
    bool invalid = false;
};

std::map<CUstream, Graph*> captures;
// Each graph allocation's graph.
std::map<CUdeviceptr, Graph*> graph_owned;
int context_tag, pool_tag;
thread_local CUcontext current_context = nullptr;

Graph* capture_of(CUstream stream);

bool tracing() {
    static const bool on = std::getenv("PEAGLE_EMULATOR_TRACE") != nullptr;
    return on;
}

// PEAGLE_EMULATOR_TRACE: one line on stderr for each operation a stream is given, as it is
// given: "issued" where it runs, "captured" where a capture records it. The lines say what a
// step asks of a GPU: its launches, copies, sets, graph replays and synchronizations.
void trace(CUstream stream, const char* format, ...) {
    if (!tracing()) return;
    std::fprintf(stderr, "peagle CUDA emulator: %s ", capture_of(stream) ? "captured" : "issued");
    va_list args;
    va_start(args, format);
    std::vfprintf(stderr, format, args);
    va_end(args);
    std::fputc('\n', stderr);
}

// And "called NAME" for each of the other driver calls that a step may make many times:
// allocations and frees, events, and lookups of kernels and attributes. Each is host time a
// GPU's driver takes, whichever stream it serves.
void trace_call(const char* name) {
    if (tracing()) std::fprintf(stderr, "peagle CUDA emulator: called %s\n", name);
}

Graph* capture_of(CUstream stream) {
    auto it = captures.find(stream);
    return it == captures.end() ? nullptr : it->second;
}

// A copy or set over memory that holds none (a graph's allocation while it is free) is
// reported as a kernel's fault is, and ends the process, as it would end the context on a GPU.
void require_usable(CUdeviceptr p, size_t bytes, const char* what) {
    if (bytes == 0 || emu::usable(p, bytes)) return;
    char where[256];
    emu::describe(p, where, sizeof where);
    std::fprintf(stderr, "peagle CUDA emulator: invalid access to %p (%s) by %s of %zu bytes\n",
                 reinterpret_cast<void*>(p), where, what, bytes);
    _exit(134);
}

void run(const Launch& l) {
    std::vector<void*> args;
    for (const auto& a : l.args) args.push_back(const_cast<char*>(a.data()));
    emu::run_grid(*l.kernel, l.grid, l.block, args.data());
}

void run(const Copy& c) {
    require_usable(c.src, c.bytes, "a copy's source");
    require_usable(c.dst, c.bytes, "a copy's destination");
    std::memmove(reinterpret_cast<void*>(c.dst), reinterpret_cast<void*>(c.src), c.bytes);
}
void run(const Set& s) {
    require_usable(s.dst, s.bytes, "a set");
    std::memset(reinterpret_cast<void*>(s.dst), s.value, s.bytes);
}
void run(const Alloc& a) { emu::unbar(a.p); }
void run(const Free& f) { emu::bar(f.p); }
void run(const Node& node) {
    std::visit([](const auto& n) { run(n); }, node);
}

// Frees what a capture allocated, with the graph it made (or the capture that failed).
void destroy(Graph* graph) {
    for (CUdeviceptr p : graph->allocations) {
        graph_owned.erase(p);
        emu::release(p);
    }
    delete graph;
}

// Runs `node` now, or records it where `stream` is capturing.
CUresult issue(CUstream stream, Node node) {
    if (Graph* g = capture_of(stream)) {
        g->nodes.push_back(std::move(node));
        return CUDA_SUCCESS;
    }
    run(node);
    return CUDA_SUCCESS;
}

// What a capture refuses: the capture is invalidated, as CUDA does.
CUresult refuse_in_capture(CUstream stream) {
    if (Graph* g = capture_of(stream)) {
        g->invalid = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return CUDA_SUCCESS;
}

bool device_range(CUdeviceptr p, size_t bytes) { return bytes == 0 || emu::in_allocation(p, bytes); }

CUresult allocate(CUdeviceptr* p, size_t bytes, CUstream stream) {
    const uintptr_t start = emu::allocate(bytes);
    if (!start) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = start;
    if (Graph* g = capture_of(stream)) {
        g->allocations.insert(start);
        graph_owned[start] = g;
        g->nodes.push_back(Alloc{start});
        emu::bar(start);
    }
    return CUDA_SUCCESS;
}

// A free in a capture is the graph's free node, of one of its own allocations that it does not
// free yet; anything else invalidates the capture. CUDA refuses a free in a capture of memory
// no graph allocated, and a second free; it allows a graph to free another graph's allocation,
// which nothing here does and the emulator does not model. A graph's allocation freed outside a
// capture holds no memory until its graph's next launch.
CUresult release(CUdeviceptr p, CUstream stream) {
    const auto owned = graph_owned.find(p);
    if (Graph* g = capture_of(stream)) {
        if (owned == graph_owned.end() || owned->second != g || g->freed_inside.count(p)) {
            std::fprintf(stderr,
                         "peagle CUDA emulator: a capture frees %p, which it did not allocate or frees already; "
                         "the capture is invalidated\n",
                         reinterpret_cast<void*>(p));
            g->invalid = true;
            return CUDA_ERROR_INVALID_VALUE;
        }
        g->nodes.push_back(Free{p});
        g->freed_inside.insert(p);
        return CUDA_SUCCESS;
    }
    if (owned == graph_owned.end()) return emu::release(p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (owned->second->freed_inside.count(p) || emu::barred(p)) return CUDA_ERROR_INVALID_VALUE;
    emu::bar(p);
    return CUDA_SUCCESS;
}

// A fault in a kernel names the kernel, the thread and the address; any other is the
// process's own, for the handler that was there before.
struct sigaction previous_segv, previous_bus;

void on_fault(int signal, siginfo_t* info, void* context) {
    const emu::Running* r = emu::running();
    if (!r) {
        const struct sigaction& previous = signal == SIGSEGV ? previous_segv : previous_bus;
        if (previous.sa_flags & SA_SIGINFO) return previous.sa_sigaction(signal, info, context);
        sigaction(signal, &previous, nullptr);
        return;
    }
    char where[160];
    emu::describe(reinterpret_cast<uintptr_t>(info->si_addr), where, sizeof where);
    char line[512];
    const int n = std::snprintf(line, sizeof line,
                                "peagle CUDA emulator: invalid access to %p (%s) in kernel %s, block (%u, %u, %u), "
                                "thread (%u, %u, %u)\n",
                                info->si_addr, where, r->kernel, r->block.x, r->block.y, r->block.z, r->thread.x,
                                r->thread.y, r->thread.z);
    if (n > 0) (void)!write(2, line, static_cast<size_t>(n));
    _exit(134);
}

void install_fault_handler() {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction action {};
        action.sa_sigaction = on_fault;
        action.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        sigaction(SIGSEGV, &action, &previous_segv);
        sigaction(SIGBUS, &action, &previous_bus);
    });
}

int attribute(CUdevice_attribute a) {
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 232448;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    default: return 0;
    }
}

const char* error_name(CUresult e) {
    switch (e) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
    case CUDA_ERROR_ILLEGAL_STATE: return "CUDA_ERROR_ILLEGAL_STATE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    default: return "CUDA_ERROR_UNKNOWN";
    }
}

// What the pool is told to keep of what is freed: remembered, not acted on (frees give memory
// back at once).
cuuint64_t release_threshold = 0;

}  // namespace

extern "C" {

CUresult cuInit(unsigned) { return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int* version) {
    *version = 13000;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetCount(int* count) {
    *count = 1;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetName(char* name, int len, CUdevice) {
    std::snprintf(name, static_cast<size_t>(len), "peagle CUDA emulator");
    return CUDA_SUCCESS;
}
CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice) {
    *bytes = emu::usage().total;
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute a, CUdevice) {
    trace_call(__func__);
    *value = attribute(a);
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice) {
    *context = reinterpret_cast<CUcontext>(&context_tag);
    return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice) { return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext context) {
    current_context = context;
    return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext* context) {
    *context = current_context;
    return CUDA_SUCCESS;
}
CUresult cuCtxPushCurrent_v2(CUcontext context) { return cuCtxSetCurrent(context); }
CUresult cuCtxPopCurrent_v2(CUcontext* context) {
    if (context) *context = current_context;
    return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* device) {
    *device = 0;
    return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize() {
    trace(nullptr, "context synchronization");
    return CUDA_SUCCESS;
}
CUresult cuCtxDestroy_v2(CUcontext) { return CUDA_SUCCESS; }

CUresult cuGetErrorString(CUresult e, const char** s) {
    *s = error_name(e);
    return CUDA_SUCCESS;
}
CUresult cuGetErrorName(CUresult e, const char** s) { return cuGetErrorString(e, s); }
CUresult cuProfilerStart() { return CUDA_SUCCESS; }
CUresult cuProfilerStop() { return CUDA_SUCCESS; }

CUresult cuStreamCreate(CUstream* stream, unsigned) {
    *stream = reinterpret_cast<CUstream>(new int);
    return CUDA_SUCCESS;
}
CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned flags, int) { return cuStreamCreate(stream, flags); }
CUresult cuStreamDestroy_v2(CUstream stream) {
    delete reinterpret_cast<int*>(stream);
    return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream stream) {
    const Guard held(driver_lock);
    trace(stream, "stream synchronization");
    return refuse_in_capture(stream);
}
CUresult cuStreamQuery(CUstream) { return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned) {
    trace_call(__func__);
    return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent* event, unsigned) {
    trace_call(__func__);
    *event = reinterpret_cast<CUevent>(new int);
    return CUDA_SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent event) {
    trace_call(__func__);
    delete reinterpret_cast<int*>(event);
    return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent, CUstream) {
    trace_call(__func__);
    return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventQuery(CUevent) { return CUDA_SUCCESS; }
CUresult cuEventElapsedTime(float* ms, CUevent, CUevent) {
    *ms = 0.f;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
    const emu::Usage u = emu::usage();
    *free = u.total - u.used;
    *total = u.total;
    return CUDA_SUCCESS;
}
CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
    const Guard held(driver_lock);
    trace_call(__func__);
    return allocate(p, bytes, nullptr);
}
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, CUstream stream) {
    const Guard held(driver_lock);
    trace_call(__func__);
    return allocate(p, bytes, stream);
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    const Guard held(driver_lock);
    trace_call(__func__);
    return release(p, nullptr);
}
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream stream) {
    const Guard held(driver_lock);
    trace_call(__func__);
    return release(p, stream);
}
CUresult cuMemAllocHost_v2(void** p, size_t bytes) {
    *p = std::malloc(bytes ? bytes : 1);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned) { return cuMemAllocHost_v2(p, bytes); }
CUresult cuMemFreeHost(void* p) {
    std::free(p);
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice) {
    *pool = reinterpret_cast<CUmemoryPool>(&pool_tag);
    return CUDA_SUCCESS;
}
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device) { return cuDeviceGetMemPool(pool, device); }
// The pool's counters are the device's: every allocation comes from it.
CUresult cuMemPoolGetAttribute(CUmemoryPool, CUmemPool_attribute a, void* value) {
    const emu::Usage u = emu::usage();
    auto* v = static_cast<cuuint64_t*>(value);
    switch (a) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *v = u.used; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *v = u.high; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *v = release_threshold; return CUDA_SUCCESS;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
}
CUresult cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute a, void* value) {
    switch (a) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*static_cast<cuuint64_t*>(value) != 0) return CUDA_ERROR_INVALID_VALUE;
        emu::reset_high();
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        release_threshold = *static_cast<cuuint64_t*>(value);
        return CUDA_SUCCESS;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
}
// The emulator's frees give memory back at once, so a pool holds nothing to trim.
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t) { return CUDA_SUCCESS; }

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
    const Guard held(driver_lock);
    trace(stream, "copy of %zu bytes, host to device", bytes);
    if (CUresult e = refuse_in_capture(stream)) return e;
    if (!device_range(dst, bytes)) return CUDA_ERROR_INVALID_VALUE;
    require_usable(dst, bytes, "a copy from the host");
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    const Guard held(driver_lock);
    trace(stream, "copy of %zu bytes, device to host", bytes);
    if (CUresult e = refuse_in_capture(stream)) return e;
    if (!device_range(src, bytes)) return CUDA_ERROR_INVALID_VALUE;
    require_usable(src, bytes, "a copy to the host");
    std::memcpy(dst, reinterpret_cast<void*>(src), bytes);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
    return cuMemcpyHtoDAsync_v2(dst, src, bytes, nullptr);
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
    return cuMemcpyDtoHAsync_v2(dst, src, bytes, nullptr);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    const Guard held(driver_lock);
    if (!device_range(dst, bytes) || !device_range(src, bytes)) return CUDA_ERROR_INVALID_VALUE;
    trace(stream, "copy of %zu bytes, device to device", bytes);
    return issue(stream, Copy{dst, src, bytes});
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    return cuMemcpyDtoDAsync_v2(dst, src, bytes, nullptr);
}
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext, CUdeviceptr src, CUcontext, size_t bytes, CUstream stream) {
    return cuMemcpyDtoDAsync_v2(dst, src, bytes, stream);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream) {
    const Guard held(driver_lock);
    if (!device_range(dst, bytes)) return CUDA_ERROR_INVALID_VALUE;
    trace(stream, "set of %zu bytes", bytes);
    return issue(stream, Set{dst, value, bytes});
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t bytes) {
    return cuMemsetD8Async(dst, value, bytes, nullptr);
}

// A module is the names of the kernels its PTX holds, which say which source's kernels it
// gets; the emulator runs those sources compiled for the host, not the PTX.
struct Module {
    std::vector<std::string> entries;
};

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
    auto* m = new Module;
    const char* ptx = static_cast<const char*>(image);
    for (const char* p = ptx ? std::strstr(ptx, ".entry ") : nullptr; p; p = std::strstr(p + 1, ".entry ")) {
        const char* name = p + 7;
        size_t len = std::strcspn(name, "( \t\n");
        m->entries.emplace_back(name, len);
    }
    *module = reinterpret_cast<CUmodule>(m);
    return CUDA_SUCCESS;
}
CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned, CUjit_option*, void**) {
    return cuModuleLoadData(module, image);
}
CUresult cuModuleLoad(CUmodule* module, const char*) { return cuModuleLoadData(module, nullptr); }
CUresult cuModuleUnload(CUmodule module) {
    delete reinterpret_cast<Module*>(module);
    return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
    trace_call(__func__);
    const emu::KernelInfo* kernel = emu::find_kernel(name, reinterpret_cast<Module*>(module)->entries);
    if (!kernel) {
        std::fprintf(stderr,
                     "peagle CUDA emulator: no kernel %s in this module (the emulator compiles kernels/*.cu and "
                     "some of candle's)\n",
                     name);
        return CUDA_ERROR_NOT_FOUND;
    }
    *function = reinterpret_cast<CUfunction>(const_cast<emu::KernelInfo*>(kernel));
    return CUDA_SUCCESS;
}
CUresult cuFuncGetAttribute(int* value, CUfunction_attribute a, CUfunction) {
    trace_call(__func__);
    *value = a == CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK ? 1024 : 0;
    return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction, CUfunction_attribute, int) { return CUDA_SUCCESS; }
CUresult cuFuncSetCacheConfig(CUfunction, CUfunc_cache) { return CUDA_SUCCESS; }

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared_bytes, CUstream stream, void** params, void** extra) {
    const Guard held(driver_lock);
    const auto* kernel = reinterpret_cast<const emu::KernelInfo*>(f);
    const unsigned long long threads = 1ull * bx * by * bz;
    if (!kernel || extra || !gx || !gy || !gz || !threads || threads > 1024 || bz > 64 || gy > 65535 || gz > 65535)
        return CUDA_ERROR_INVALID_VALUE;
    // Dynamic shared memory needs `extern __shared__`, which the emulator's kernels do not use.
    if (shared_bytes) return CUDA_ERROR_NOT_SUPPORTED;
    install_fault_handler();
    trace(stream, "%s<<<(%u, %u, %u), (%u, %u, %u)>>>", kernel->name.c_str(), gx, gy, gz, bx, by, bz);
    Launch l{kernel, {gx, gy, gz}, {bx, by, bz}, {}};
    for (size_t i = 0; i < kernel->arg_sizes.size(); ++i) {
        const char* p = static_cast<const char*>(params[i]);
        l.args.emplace_back(p, p + kernel->arg_sizes[i]);
    }
    return issue(stream, std::move(l));
}

CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode) {
    const Guard held(driver_lock);
    if (capture_of(stream)) return CUDA_ERROR_ILLEGAL_STATE;
    captures[stream] = new Graph;
    return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
    const Guard held(driver_lock);
    Graph* captured = capture_of(stream);
    if (!captured) return CUDA_ERROR_ILLEGAL_STATE;
    captures.erase(stream);
    if (captured->invalid) {
        *graph = nullptr;
        destroy(captured);
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *graph = reinterpret_cast<CUgraph>(captured);
    return CUDA_SUCCESS;
}
CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
    const Guard held(driver_lock);
    Graph* captured = capture_of(stream);
    *status = !captured ? CU_STREAM_CAPTURE_STATUS_NONE
                        : (captured->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE);
    return CUDA_SUCCESS;
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
    reinterpret_cast<Graph*>(graph)->auto_free = flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
    *exec = reinterpret_cast<CUgraphExec>(graph);
    return CUDA_SUCCESS;
}
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    const Guard held(driver_lock);
    if (capture_of(stream)) return CUDA_ERROR_NOT_SUPPORTED;
    const Graph* graph = reinterpret_cast<Graph*>(exec);
    std::vector<CUdeviceptr> left;
    for (CUdeviceptr p : graph->allocations)
        if (!graph->freed_inside.count(p) && !emu::barred(p)) left.push_back(p);
    if (!left.empty() && !graph->auto_free) return CUDA_ERROR_INVALID_VALUE;
    for (CUdeviceptr p : left) emu::bar(p);
    trace(stream, "graph of %zu nodes", graph->nodes.size());
    for (const Node& node : graph->nodes) run(node);
    return CUDA_SUCCESS;
}
CUresult cuGraphExecDestroy(CUgraphExec) { return CUDA_SUCCESS; }
CUresult cuGraphDestroy(CUgraph graph) {
    const Guard held(driver_lock);
    destroy(reinterpret_cast<Graph*>(graph));
    return CUDA_SUCCESS;
}

}  // extern "C"

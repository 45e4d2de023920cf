// libcuda's driver API on the host: what cudarc and candle call, over the emulator's memory
// (memory.cpp) and kernels (fibers.cpp). One device; every stream runs its work as it is
// issued, in issue order, so an asynchronous call has finished when it returns. A stream under
// capture records its work into a graph instead (graph.cpp).
#include "driver.h"
#include "launch.h"
#include "memory.h"

#include <cuda.h>
#include <signal.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace driver {

std::recursive_mutex lock;

bool tracing() {
    static const bool on = std::getenv("PEAGLE_EMULATOR_TRACE") != nullptr;
    return on;
}

// PEAGLE_EMULATOR_TRACE: one line on stderr for each operation a stream is given, as it is
// given: "issued" where it runs, "captured" where a capture records it. The lines say what a
// step asks of a GPU: its launches, copies, sets, graph replays and synchronizations.
void trace(CUstream stream, const char* format, ...) {
    if (!tracing()) return;
    std::fprintf(stderr, "peagle CUDA emulator: %s ", capturing(stream) ? "captured" : "issued");
    va_list args;
    va_start(args, format);
    std::vfprintf(stderr, format, args);
    va_end(args);
    std::fputc('\n', stderr);
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

}  // namespace driver

using namespace driver;

namespace {

int context_tag, pool_tag;
thread_local CUcontext current_context = nullptr;

// And "called NAME" for each of the other driver calls that a step may make many times:
// allocations and frees, events, and lookups of kernels and attributes. Each is host time a
// GPU's driver takes, whichever stream it serves.
void trace_call(const char* name) {
    if (tracing()) std::fprintf(stderr, "peagle CUDA emulator: called %s\n", name);
}

bool device_range(CUdeviceptr p, size_t bytes) { return bytes == 0 || emu::in_allocation(p, bytes); }

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
    const Guard held(lock);
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
    const Guard held(lock);
    trace_call(__func__);
    return allocate(p, bytes, nullptr);
}
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, CUstream stream) {
    const Guard held(lock);
    trace_call(__func__);
    return allocate(p, bytes, stream);
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    const Guard held(lock);
    trace_call(__func__);
    return release(p, nullptr);
}
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream stream) {
    const Guard held(lock);
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
    const Guard held(lock);
    trace(stream, "copy of %zu bytes, host to device", bytes);
    if (CUresult e = refuse_in_capture(stream)) return e;
    if (!device_range(dst, bytes)) return CUDA_ERROR_INVALID_VALUE;
    require_usable(dst, bytes, "a copy from the host");
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
    const Guard held(lock);
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
    const Guard held(lock);
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
    const Guard held(lock);
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
    const Guard held(lock);
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

}  // extern "C"

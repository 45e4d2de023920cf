// What the emulator's driver API (driver.cpp) and its CUDA graphs (graph.cpp) share: the
// driver's lock, its trace, and the operations a stream is given, which it runs as it is given
// them or a capture records as a graph's nodes.
#pragma once
#include "launch.h"

#include <cuda.h>

#include <mutex>
#include <variant>
#include <vector>

namespace driver {

// Held by every driver call that touches the emulator's state.
extern std::recursive_mutex lock;
using Guard = std::lock_guard<std::recursive_mutex>;

// PEAGLE_EMULATOR_TRACE's line for an operation `stream` is given (driver.cpp).
void trace(CUstream stream, const char* format, ...);
// Ends the process, as a fault would end the context on a GPU, where a copy or set (`what`)
// touches memory that holds none.
void require_usable(CUdeviceptr p, size_t bytes, const char* what);

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

// Whether `stream` is capturing into a graph.
bool capturing(CUstream stream);
// Runs `node` now, or records it where `stream` is capturing.
CUresult issue(CUstream stream, Node node);
// What a capture refuses: the capture is invalidated, as CUDA does.
CUresult refuse_in_capture(CUstream stream);
// New memory; in a capture, the graph's allocation node.
CUresult allocate(CUdeviceptr* p, size_t bytes, CUstream stream);
// A free; in a capture, the graph's free node (graph.cpp says which it may free).
CUresult release(CUdeviceptr p, CUstream stream);

}  // namespace driver

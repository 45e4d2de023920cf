// CUDA graphs on the emulator: a stream's capture into a graph, and the graph's replay. A
// capture records the launches, copies, sets, allocations and frees its stream is given as
// the graph's nodes, as CUDA's does, and refuses what CUDA refuses there (a copy to or from the
// host, a synchronization, a free of memory the capture did not allocate); a launch of the
// graph runs its nodes in order.
#include "driver.h"
#include "memory.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <set>

namespace driver {
namespace {

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

Graph* capture_of(CUstream stream) {
    auto it = captures.find(stream);
    return it == captures.end() ? nullptr : it->second;
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

}  // namespace

bool capturing(CUstream stream) { return capture_of(stream) != nullptr; }

CUresult issue(CUstream stream, Node node) {
    if (Graph* g = capture_of(stream)) {
        g->nodes.push_back(std::move(node));
        return CUDA_SUCCESS;
    }
    run(node);
    return CUDA_SUCCESS;
}

CUresult refuse_in_capture(CUstream stream) {
    if (Graph* g = capture_of(stream)) {
        g->invalid = true;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return CUDA_SUCCESS;
}

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

}  // namespace driver

using namespace driver;

extern "C" {

CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode) {
    const Guard held(lock);
    if (capture_of(stream)) return CUDA_ERROR_ILLEGAL_STATE;
    captures[stream] = new Graph;
    return CUDA_SUCCESS;
}
CUresult cuStreamEndCapture(CUstream stream, CUgraph* graph) {
    const Guard held(lock);
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
    const Guard held(lock);
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
    const Guard held(lock);
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
    const Guard held(lock);
    destroy(reinterpret_cast<Graph*>(graph));
    return CUDA_SUCCESS;
}

}  // extern "C"

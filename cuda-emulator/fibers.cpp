// A block's CUDA threads as fibers on one host thread (x86-64). A fiber runs until it reaches a
// barrier (`__syncthreads`) or a warp collective (a shuffle, a ballot, `__syncwarp`, an mma),
// or returns; then it releases the barrier if it was the last to arrive, and hands over to the
// next ready fiber, fibers becoming ready in thread order. A barrier no thread can pass is a
// deadlock, reported as a hang on a GPU would be noticed.
#include "device.h"
#include "launch.h"

#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <memory>

dim3 threadIdx, blockIdx, blockDim, gridDim;

// emu_switch(save, load): saves the callee-saved registers on the stack and the stack pointer
// in *save, and resumes the stack at `load`, which an emu_switch saved or `new_stack` made. A
// switch is a few instructions, where swapcontext makes a system call: a block's threads
// switch at every barrier and shuffle. The floating-point control words are the thread's, as
// no kernel changes them.
extern "C" void emu_switch(void** save, void* load);
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

namespace emu {
namespace {

enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };

// The most bytes a lane gives a warp collective: an mma's six registers.
constexpr size_t SLOT_BYTES = 32;
// Each fiber's stack: kernels keep their register arrays there.
constexpr size_t STACK_BYTES = 256 << 10;
constexpr size_t PAGE = 4096;

struct Fiber {
    void* stack_pointer;
    dim3 index;
    int warp = 0, lane = 0;
    State state = State::Ready;
    unsigned mask = 0;
    // How many collectives the fiber has joined: their values alternate between two slots, so
    // that a lane that went on to the next one leaves the last one's values in place.
    unsigned collectives = 0;
    // The lanes that joined the fiber's last collective.
    unsigned joined = 0;
};

struct Warp {
    unsigned live = 0, waiting = 0;
    unsigned char slots[2][32][SLOT_BYTES];
};

struct Block {
    const KernelInfo* kernel = nullptr;
    void** args = nullptr;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    int live = 0, at_barrier = 0, current = -1;
    // The fibers that may run, in the order they became ready: a ring, as each fiber is in it
    // at most once.
    std::vector<int> ready;
    size_t ready_head = 0, ready_count = 0;
    void* scheduler;
    Running running;
};

Block* block = nullptr;

// Stacks, kept from launch to launch, each above a guard page that turns an overflow into a
// fault rather than into another fiber's stack.
std::vector<char*>& stacks() {
    static std::vector<char*> stacks;
    return stacks;
}

char* stack(size_t i) {
    auto& all = stacks();
    while (all.size() <= i) {
        void* p = mmap(nullptr, STACK_BYTES + PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (p == MAP_FAILED) trap("no memory for a thread's stack");
        mprotect(p, PAGE, PROT_NONE);
        all.push_back(static_cast<char*>(p) + PAGE);
    }
    return all[i];
}

Fiber& self() { return block->fibers[block->current]; }

void set_indices(const Fiber& f) {
    threadIdx = f.index;
    block->running.thread = {f.index.x, f.index.y, f.index.z};
}

void push_ready(int i) {
    block->ready[(block->ready_head + block->ready_count++) % block->ready.size()] = i;
}

int pop_ready() {
    const int i = block->ready[block->ready_head];
    block->ready_head = (block->ready_head + 1) % block->ready.size();
    --block->ready_count;
    return i;
}

unsigned lanes_waited_for(const Warp& w, unsigned mask) { return mask & w.live; }

void release_warp(int warp) {
    Warp& w = block->warps[warp];
    if (!w.waiting) return;
    // Every waiting lane asked for the same lanes, or the kernel diverged at a collective,
    // which CUDA leaves undefined; the first waiting lane's mask decides.
    const int first = __builtin_ctz(w.waiting);
    const Fiber& f = block->fibers[warp * 32 + first];
    if ((lanes_waited_for(w, f.mask) & ~w.waiting) != 0) return;
    for (int lane = 0; lane < 32; ++lane) {
        if (!(w.waiting >> lane & 1)) continue;
        Fiber& lane_fiber = block->fibers[warp * 32 + lane];
        lane_fiber.state = State::Ready;
        lane_fiber.joined = w.waiting;
        push_ready(warp * 32 + lane);
    }
    w.waiting = 0;
}

void release_block() {
    if (block->at_barrier == 0 || block->at_barrier != block->live) return;
    for (size_t i = 0; i < block->fibers.size(); ++i) {
        if (block->fibers[i].state != State::AtBlockBarrier) continue;
        block->fibers[i].state = State::Ready;
        push_ready(static_cast<int>(i));
    }
    block->at_barrier = 0;
}

// The calling fiber stops in `state`, and what it completes is released: a barrier, the
// warp's collective, or (done) the barriers its exit leaves waiting for no one else. The next
// ready fiber runs in its place, itself where it was released first; with none, the
// scheduler, which ends the block or reports a deadlock.
void wait(State state) {
    Fiber& f = self();
    f.state = state;
    switch (state) {
    case State::Done:
        --block->live;
        block->warps[f.warp].live &= ~(1u << f.lane);
        release_warp(f.warp);
        release_block();
        break;
    case State::AtWarpBarrier: release_warp(f.warp); break;
    case State::AtBlockBarrier: release_block(); break;
    case State::Ready: break;
    }
    if (block->ready_count == 0) {
        emu_switch(&f.stack_pointer, block->scheduler);
        return;
    }
    const int next = pop_ready();
    if (next == block->current) return;
    block->current = next;
    set_indices(block->fibers[next]);
    emu_switch(&f.stack_pointer, block->fibers[next].stack_pointer);
}

// A fiber's first frame: the thread's kernel, then the next fiber for good.
[[noreturn]] void fiber_main() {
    block->kernel->invoke(block->args);
    wait(State::Done);
    std::abort();
}

// A stack that an emu_switch resumes at fiber_main, as if it had been called: the saved
// registers zero, and the stack aligned as at a call.
void* new_stack(char* base) {
    auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(base + STACK_BYTES) & ~uintptr_t(15));
    *--top = 0;
    *--top = reinterpret_cast<uint64_t>(&fiber_main);
    for (int i = 0; i < 6; ++i) *--top = 0;
    return top;
}

[[noreturn]] void report(const char* what) {
    const Running& r = block->running;
    std::fprintf(stderr,
                 "peagle CUDA emulator: %s in kernel %s, block (%u, %u, %u), thread (%u, %u, %u)\n", what,
                 r.kernel, r.block.x, r.block.y, r.block.z, r.thread.x, r.thread.y, r.thread.z);
    std::fflush(stderr);
    std::abort();
}

void run_block(Block& b, unsigned threads) {
    // Kept from block to block, as a launch's blocks are alike: each field is set anew, and a
    // slot is written before it is read.
    b.fibers.resize(threads);
    b.warps.resize((threads + 31) / 32);
    for (Warp& w : b.warps) w.live = w.waiting = 0;
    b.ready.resize(threads);
    b.ready_head = b.ready_count = 0;
    b.live = static_cast<int>(threads);
    b.at_barrier = 0;
    for (unsigned i = 0; i < threads; ++i) {
        Fiber& f = b.fibers[i];
        f = Fiber{};
        f.index = dim3(i % blockDim.x, i / blockDim.x % blockDim.y, i / (blockDim.x * blockDim.y));
        f.warp = static_cast<int>(i / 32);
        f.lane = static_cast<int>(i % 32);
        b.warps[f.warp].live |= 1u << f.lane;
        f.stack_pointer = new_stack(stack(i));
        push_ready(static_cast<int>(i));
    }
    // The fibers hand over to one another; the scheduler resumes when none is ready.
    b.current = pop_ready();
    set_indices(b.fibers[b.current]);
    emu_switch(&b.scheduler, b.fibers[b.current].stack_pointer);
    if (b.live > 0) {
        for (const Fiber& f : b.fibers)
            if (f.state != State::Done) {
                set_indices(f);
                break;
            }
        report(b.at_barrier ? "a deadlock at __syncthreads (a thread that never arrives)"
                            : "a deadlock at a warp collective (a lane that never arrives)");
    }
}

std::multimap<std::string, KernelInfo>& registry() {
    static std::multimap<std::string, KernelInfo> kernels;
    return kernels;
}

// Whether `source` holds a kernel of each name in `entries`.
bool source_holds(const std::string& source, const std::vector<std::string>& entries) {
    for (const std::string& entry : entries) {
        auto [first, last] = registry().equal_range(entry);
        bool found = false;
        for (auto it = first; it != last; ++it) found = found || it->second.source == source;
        if (!found) return false;
    }
    return true;
}

size_t kernels_of(const std::string& source) {
    size_t n = 0;
    for (const auto& [name, kernel] : registry()) n += kernel.source == source;
    return n;
}

}  // namespace

void register_kernel(KernelInfo info) {
    std::string name = info.name;
    registry().emplace(std::move(name), std::move(info));
}

// A module's source is the one of the fewest kernels that holds all its entries: candle's
// reduce.cu has kernels of the names of all of peagle's rope.cu, and more.
const KernelInfo* find_kernel(const std::string& name, const std::vector<std::string>& entries) {
    const KernelInfo* found = nullptr;
    size_t found_size = 0;
    bool tied = false;
    auto [first, last] = registry().equal_range(name);
    for (auto it = first; it != last; ++it) {
        const KernelInfo& k = it->second;
        const bool in_module =
            entries.empty() ? k.source.rfind("peagle/", 0) != 0 : source_holds(k.source, entries);
        if (!in_module) continue;
        const size_t size = kernels_of(k.source);
        if (found && size == found_size) tied = true;
        if (!found || size < found_size) {
            found = &k;
            found_size = size;
            tied = false;
        }
    }
    return tied ? nullptr : found;
}

const Running* running() { return block ? &block->running : nullptr; }

void run_grid(const KernelInfo& kernel, Dim grid, Dim threads, void** args) {
    Block b;
    b.kernel = &kernel;
    b.args = args;
    b.running.kernel = kernel.name.c_str();
    block = &b;
    gridDim = dim3(grid.x, grid.y, grid.z);
    blockDim = dim3(threads.x, threads.y, threads.z);
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) {
                blockIdx = dim3(x, y, z);
                b.running.block = {x, y, z};
                run_block(b, threads.x * threads.y * threads.z);
            }
    block = nullptr;
}

void block_barrier() {
    ++block->at_barrier;
    wait(State::AtBlockBarrier);
}

void warp_exchange(unsigned mask, const void* value, size_t size) {
    Fiber& f = self();
    Warp& w = block->warps[f.warp];
    if (size > SLOT_BYTES) trap("a warp collective of more than 32 bytes a lane");
    if (!(mask >> f.lane & 1)) trap("a warp collective by a lane outside its own mask");
    if (size) std::memcpy(w.slots[f.collectives & 1][f.lane], value, size);
    f.mask = mask;
    w.waiting |= 1u << f.lane;
    wait(State::AtWarpBarrier);
    ++f.collectives;
}

const void* lane_value(int lane) {
    const Fiber& f = self();
    return block->warps[f.warp].slots[(f.collectives - 1) & 1][lane];
}

unsigned live_lanes() { return block->warps[self().warp].live; }

unsigned joined_lanes() { return self().joined; }

[[noreturn]] void trap(const char* why) {
    if (!block) {
        std::fprintf(stderr, "peagle CUDA emulator: %s\n", why);
        std::abort();
    }
    report(why);
}

namespace {
float bf16_low(uint32_t r) { return __uint_as_float(r << 16); }
float bf16_high(uint32_t r) { return __uint_as_float(r & 0xffff0000u); }
}  // namespace

// The PTX ISA's fragment layouts of m16n8k16 with bf16 operands and f32 accumulators, lane
// (g, t) = (lane / 4, lane % 4): a0..a3 hold A[g][2t..], A[g + 8][2t..], A[g][2t + 8..] and
// A[g + 8][2t + 8..]; b0, b1 hold B[2t..][g] and B[2t + 8..][g]; d0..d3 are D[g][2t],
// D[g][2t + 1], D[g + 8][2t] and D[g + 8][2t + 1]; a register's low half is the lower index.
// The products are exact and summed in double, then added to the accumulator and rounded
// once: the hardware's order within an instruction is unspecified, so the emulator's matches
// a GPU's to about an ulp, not bit for bit.
void mma_m16n8k16_bf16(float* d, const uint32_t* a, const uint32_t* b) {
    uint32_t regs[6];
    std::memcpy(regs, a, 16);
    std::memcpy(regs + 4, b, 8);
    if (live_lanes() != 0xffffffffu) trap("an mma with fewer than 32 live lanes");
    warp_exchange(0xffffffffu, regs, sizeof regs);
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, t = lane % 4;
        uint32_t r[6];
        std::memcpy(r, lane_value(lane), sizeof r);
        const int rows[4] = {g, g + 8, g, g + 8}, cols[4] = {2 * t, 2 * t, 2 * t + 8, 2 * t + 8};
        for (int i = 0; i < 4; ++i) {
            A[rows[i]][cols[i]] = bf16_low(r[i]);
            A[rows[i]][cols[i] + 1] = bf16_high(r[i]);
        }
        B[2 * t][g] = bf16_low(r[4]);
        B[2 * t + 1][g] = bf16_high(r[4]);
        B[2 * t + 8][g] = bf16_low(r[5]);
        B[2 * t + 9][g] = bf16_high(r[5]);
    }
    const int lane = self().lane, g = lane / 4, t = lane % 4;
    const int out_rows[4] = {g, g, g + 8, g + 8}, out_cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int i = 0; i < 4; ++i) {
        double sum = 0;
        for (int k = 0; k < 16; ++k) sum += double(A[out_rows[i]][k]) * double(B[k][out_cols[i]]);
        d[i] = static_cast<float>(sum + double(d[i]));
    }
}

}  // namespace emu

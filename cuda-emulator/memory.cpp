#include "memory.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

namespace emu {
namespace {

constexpr size_t PAGE = 4096, ALIGN = 256;
// New memory holds anything on a GPU; here, up to this size, every byte 0xFF (NaN as a float,
// -1 as an integer), so that a read of what nothing wrote shows. Larger allocations (a KV
// cache, weights) stay zero, untouched pages costing the host nothing.
constexpr size_t POISONED_UP_TO = size_t(64) << 20;

struct Allocation {
    char* map;
    size_t map_bytes, bytes;
    bool barred = false;
};

struct Memory {
    std::mutex lock;
    std::map<uintptr_t, Allocation> allocations;
    size_t total, used = 0, high = 0;
};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// What an allocation of `bytes` takes of the device: at least one aligned unit.
size_t footprint(size_t bytes) { return round_up(bytes ? bytes : 1, ALIGN); }

// The emulated device's size: PEAGLE_EMULATOR_MEMORY_MIB, 2 GiB by default; what the engine
// sizes its KV cache by.
size_t device_bytes() {
    const char* mib = std::getenv("PEAGLE_EMULATOR_MEMORY_MIB");
    return (mib ? std::strtoull(mib, nullptr, 10) : 2048) << 20;
}

Memory& memory() {
    static Memory* m = [] {
        auto* m = new Memory;
        m->total = device_bytes();
        return m;
    }();
    return *m;
}

// The allocation that `p` lies in, or end().
std::map<uintptr_t, Allocation>::iterator containing(Memory& m, uintptr_t p) {
    auto it = m.allocations.upper_bound(p);
    if (it == m.allocations.begin()) return m.allocations.end();
    --it;
    return p < it->first + it->second.bytes ? it : m.allocations.end();
}

}  // namespace

uintptr_t allocate(size_t bytes) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    const size_t rounded = footprint(bytes);
    if (m.used + rounded > m.total) return 0;
    const size_t map_bytes = round_up(rounded, PAGE) + PAGE;
    void* map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) return 0;
    char* guard_page = static_cast<char*>(map) + map_bytes - PAGE;
    mprotect(guard_page, PAGE, PROT_NONE);
    const auto start = reinterpret_cast<uintptr_t>(guard_page - rounded);
    if (bytes <= POISONED_UP_TO) std::memset(reinterpret_cast<void*>(start), 0xFF, bytes);
    m.allocations[start] = Allocation{static_cast<char*>(map), map_bytes, bytes};
    m.used += rounded;
    if (m.used > m.high) m.high = m.used;
    return start;
}

bool release(uintptr_t start) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    auto it = m.allocations.find(start);
    if (it == m.allocations.end()) return false;
    m.used -= footprint(it->second.bytes);
    munmap(it->second.map, it->second.map_bytes);
    m.allocations.erase(it);
    return true;
}

bool in_allocation(uintptr_t p, size_t bytes) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    auto it = containing(m, p);
    return it != m.allocations.end() && p + bytes <= it->first + it->second.bytes;
}

bool usable(uintptr_t p, size_t bytes) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    auto it = containing(m, p);
    return it != m.allocations.end() && p + bytes <= it->first + it->second.bytes && !it->second.barred;
}

// Opens or closes every page of an allocation's mapping but its guard page.
void set_barred(uintptr_t start, bool barred) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    auto it = m.allocations.find(start);
    if (it == m.allocations.end()) std::abort();
    Allocation& a = it->second;
    if (mprotect(a.map, a.map_bytes - PAGE, barred ? PROT_NONE : PROT_READ | PROT_WRITE) != 0) std::abort();
    if (!barred) std::memset(reinterpret_cast<void*>(start), 0xFF, a.bytes);
    a.barred = barred;
}

void bar(uintptr_t start) { set_barred(start, true); }
void unbar(uintptr_t start) { set_barred(start, false); }

bool barred(uintptr_t start) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    auto it = m.allocations.find(start);
    return it != m.allocations.end() && it->second.barred;
}

// Called from the fault handler: takes no lock, as the faulting thread may hold none and no
// other thread allocates while a launch runs under the driver's lock.
void describe(uintptr_t p, char* out, size_t len) {
    Memory& m = memory();
    auto it = m.allocations.upper_bound(p);
    if (it == m.allocations.begin()) {
        std::snprintf(out, len, "outside every allocation");
        return;
    }
    --it;
    const uintptr_t end = it->first + it->second.bytes;
    if (p < end)
        std::snprintf(out, len, "byte %zu of an allocation of %zu bytes%s", size_t(p - it->first), it->second.bytes,
                      it->second.barred ? " that a CUDA graph holds no memory for now: freed, or not yet allocated "
                                          "by a launch"
                                        : "");
    else
        std::snprintf(out, len, "%zu bytes past the end of an allocation of %zu bytes", size_t(p - end),
                      it->second.bytes);
}

Usage usage() {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    return {m.total, m.used, m.high};
}

void reset_high() {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    m.high = m.used;
}

}  // namespace emu

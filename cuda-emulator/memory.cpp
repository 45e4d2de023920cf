#include "memory.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
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
constexpr int POISON = 0xFF;

// Freed allocations keep their pages' addresses, closed and given back to the host, for this
// many frees after theirs: a stale pointer into one then faults, where a new allocation at the
// same address would have let it read another's data unseen.
constexpr size_t QUARANTINED = 4096;

struct Allocation {
    char* map;
    size_t map_bytes, bytes;
    bool barred = false, freed = false;
};

struct Memory {
    std::mutex lock;
    // Live allocations and quarantined freed ones, by start.
    std::map<uintptr_t, Allocation> allocations;
    std::deque<uintptr_t> quarantine;
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

// The live allocation that `p` lies in, or end().
std::map<uintptr_t, Allocation>::iterator containing(Memory& m, uintptr_t p) {
    auto it = m.allocations.upper_bound(p);
    if (it == m.allocations.begin()) return m.allocations.end();
    --it;
    return p < it->first + it->second.bytes && !it->second.freed ? it : m.allocations.end();
}

// The live allocation that [p, p + bytes) lies in, or null.
const Allocation* spanning(Memory& m, uintptr_t p, size_t bytes) {
    auto it = containing(m, p);
    return it != m.allocations.end() && p + bytes <= it->first + it->second.bytes ? &it->second : nullptr;
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
    if (bytes <= POISONED_UP_TO) std::memset(reinterpret_cast<void*>(start), POISON, bytes);
    m.allocations[start] = Allocation{static_cast<char*>(map), map_bytes, bytes};
    m.used += rounded;
    if (m.used > m.high) m.high = m.used;
    return start;
}

bool release(uintptr_t start) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    auto it = m.allocations.find(start);
    if (it == m.allocations.end() || it->second.freed) return false;
    Allocation& a = it->second;
    m.used -= footprint(a.bytes);
    if (madvise(a.map, a.map_bytes, MADV_DONTNEED) != 0 || mprotect(a.map, a.map_bytes, PROT_NONE) != 0) std::abort();
    a.freed = true;
    m.quarantine.push_back(start);
    if (m.quarantine.size() > QUARANTINED) {
        auto oldest = m.allocations.find(m.quarantine.front());
        munmap(oldest->second.map, oldest->second.map_bytes);
        m.allocations.erase(oldest);
        m.quarantine.pop_front();
    }
    return true;
}

bool in_allocation(uintptr_t p, size_t bytes) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    return spanning(m, p, bytes) != nullptr;
}

bool usable(uintptr_t p, size_t bytes) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    const Allocation* a = spanning(m, p, bytes);
    return a && !a->barred;
}

// Opens or closes every page of an allocation's mapping but its guard page.
void set_barred(uintptr_t start, bool barred) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    auto it = m.allocations.find(start);
    if (it == m.allocations.end() || it->second.freed) std::abort();
    Allocation& a = it->second;
    if (mprotect(a.map, a.map_bytes - PAGE, barred ? PROT_NONE : PROT_READ | PROT_WRITE) != 0) std::abort();
    if (!barred) std::memset(reinterpret_cast<void*>(start), POISON, a.bytes);
    a.barred = barred;
}

void bar(uintptr_t start) { set_barred(start, true); }
void unbar(uintptr_t start) { set_barred(start, false); }

bool barred(uintptr_t start) {
    Memory& m = memory();
    std::lock_guard<std::mutex> guard(m.lock);
    auto it = m.allocations.find(start);
    return it != m.allocations.end() && !it->second.freed && it->second.barred;
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
    const char* state = it->second.freed    ? ", which was freed"
                        : it->second.barred ? " that a CUDA graph holds no memory for now: freed, or not yet "
                                              "allocated by a launch"
                                            : "";
    if (p < end)
        std::snprintf(out, len, "byte %zu of an allocation of %zu bytes%s", size_t(p - it->first), it->second.bytes,
                      state);
    else
        std::snprintf(out, len, "%zu bytes past the end of an allocation of %zu bytes%s", size_t(p - end),
                      it->second.bytes, state);
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

// Device memory of the emulator: host pages, one mapping an allocation, that ends at a page no
// access may touch, so that a kernel reading or writing past an allocation's end by more than
// its 256-byte rounding faults there, and the fault handler names the kernel and thread.
#pragma once
#include <cstddef>
#include <cstdint>

namespace emu {

// A new allocation of `bytes`, 256-byte aligned; 0 when the emulated device is full.
uintptr_t allocate(size_t bytes);
// Frees an allocation by its start; false if `start` begins none.
bool release(uintptr_t start);
// Whether [p, p + bytes) lies in one allocation.
bool in_allocation(uintptr_t p, size_t bytes);
// Where `p` is, for a fault's report: the allocation it lies in or just after.
void describe(uintptr_t p, char* out, size_t len);

struct Usage {
    size_t total, used, high;
};
Usage usage();
void reset_high();

}  // namespace emu

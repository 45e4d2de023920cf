// Device memory of the emulator: host pages, one mapping an allocation, that ends at a page no
// access may touch, so that a kernel reading or writing past an allocation's end by more than
// its 256-byte rounding faults there, and the fault handler names the kernel and thread.
// A CUDA graph's allocations keep their addresses for the graph's life but hold memory only
// from their allocation in a launch to their free: between, they are barred, every page of
// them closed to access, so that a use of one then faults as a use past an end does.
#pragma once
#include <cstddef>
#include <cstdint>

namespace emu {

// A new allocation of `bytes`, 256-byte aligned, each byte 0xFF up to 64 MiB (memory.cpp);
// 0 when the emulated device is full.
uintptr_t allocate(size_t bytes);
// Frees an allocation by its start; false if `start` begins none. Its addresses stay closed
// for a while (memory.cpp), so that a use after the free faults.
bool release(uintptr_t start);
// Whether [p, p + bytes) lies in one allocation, barred or not.
bool in_allocation(uintptr_t p, size_t bytes);
// Whether [p, p + bytes) lies in one allocation that is not barred.
bool usable(uintptr_t p, size_t bytes);
// Closes an allocation to every access; its contents are lost.
void bar(uintptr_t start);
// Opens a barred allocation again, its every byte 0xFF (CUDA's new memory holds anything;
// these bytes are NaN as floats and -1 as integers, so that a read of them shows).
void unbar(uintptr_t start);
bool barred(uintptr_t start);
// Where `p` is, for a fault's report: the allocation it lies in or just after.
void describe(uintptr_t p, char* out, size_t len);

struct Usage {
    size_t total, used, high;
};
Usage usage();
void reset_high();

}  // namespace emu

// How the emulator's driver (driver.cpp) finds and runs a kernel: the registry of kernels by
// name, filled as the library loads, and a launch's grid run block by block (fibers.cpp).
#pragma once
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace emu {

// Calls a kernel with its arguments as cuLaunchKernel passes them: a pointer to each value.
using Invoke = void (*)(void** args);

struct KernelInfo {
    // The source it was compiled from ("peagle/rope", "candle/reduce"): a module of its own on
    // a GPU, so that two sources may hold kernels of the same name.
    std::string source;
    std::string name;
    Invoke invoke;
    // Each argument's size, by which a launch copies its arguments (a graph keeps them).
    std::vector<size_t> arg_sizes;
};

void register_kernel(KernelInfo info);
// Kernel `name` of the module whose PTX has the kernels `entries`: the one of the source of
// fewest kernels that holds them all. A module of no entries (a library's PTX built empty, as
// the emulated build builds candle's) takes it from the library's sources. Null for none, or
// where two sources fit alike.
const KernelInfo* find_kernel(const std::string& name, const std::vector<std::string>& entries);

template <typename F> struct Signature;
template <typename... A> struct Signature<void (*)(A...)> {
    template <auto Kernel, size_t... I> static void call(void** args, std::index_sequence<I...>) {
        Kernel(*static_cast<std::decay_t<A>*>(args[I])...);
    }
    template <auto Kernel> static void invoke(void** args) { call<Kernel>(args, std::index_sequence_for<A...>{}); }
    static std::vector<size_t> sizes() { return {sizeof(std::decay_t<A>)...}; }
};

struct Dim {
    unsigned x = 1, y = 1, z = 1;
};

// Runs every block of the grid, one after another, each block's threads as fibers. A trap or a
// deadlock is reported with the kernel and thread, and ends the process, as it would end the
// context on a GPU.
void run_grid(const KernelInfo& kernel, Dim grid, Dim block, void** args);

// The launch in progress, for a fault's report: null between launches.
struct Running {
    const char* kernel;
    Dim block, thread;
};
const Running* running();

}  // namespace emu

// Registers the extern "C" kernel NAME, defined earlier in the same translation unit, as a
// kernel of the source EMU_SOURCE.
#define EMU_REGISTER(NAME)                                                                             \
    static const bool emu_registered_##NAME = (emu::register_kernel({EMU_SOURCE, #NAME,               \
                                                                     &emu::Signature<decltype(&NAME)>::invoke<&NAME>, \
                                                                     emu::Signature<decltype(&NAME)>::sizes()}), \
                                               true);

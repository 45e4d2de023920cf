#!/usr/bin/env bash
# Builds the CUDA emulator (cuda-emulator/README.md): libcuda.so.1, libcublas.so.13 and
# libcurand.so.10 in target/cuda-emulator/lib, which run a cuda-feature binary's GPU work on
# the host, peagle's kernels (kernels/*.cu) and candle's compiled as host C++; then runs the
# emulator's own tests (cuda-emulator/self_test.cpp). Needs only the CUDA headers, which
# scripts/build_cuda.sh --toolkit installs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build_cuda.sh --toolkit
cuda_include=$PWD/.cuda/toolkit/nvidia/cu13/include
emulator=$PWD/cuda-emulator
out=$PWD/target/cuda-emulator
mkdir -p "$out/obj" "$out/lib"

candle_kernels=$(bash scripts/package_dir.sh candle-kernels)/src
cudarc=$(bash scripts/package_dir.sh cudarc)/src

# candle's kernels that peagle's tensors use on a GPU; sort.cu needs dynamic shared memory,
# which the emulator does not have, and the quantized and MoE ones are never called.
sources=("$PWD"/kernels/*.cu)
for name in affine binary cast conv fill indexing reduce ternary unary; do sources+=("$candle_kernels/$name.cu"); done

cxx=(g++ -std=c++17 -fPIC -ffp-contract=off -fno-strict-aliasing -Wno-unknown-pragmas -I"$emulator"
    -I"$cuda_include" -I"$cuda_include/cccl")
# up_to_date OBJECT SOURCE: whether OBJECT is newer than SOURCE and than everything it may
# include, the headers beside it and the emulator's.
up_to_date() {
    local object=$1 file
    for file in "$2" "$(dirname "$2")"/*.cuh "$emulator"/*.h; do
        [ "$object" -nt "$file" ] || return 1
    done
}
# compile SOURCE OBJECT ORIGIN: the source as host C++ with its extern "C" kernels registered by
# name, which a first, unoptimised compile lists.
compile() {
    local source=$1 object=$2 origin=$3 names
    up_to_date "$object" "$source" && return 0
    "${cxx[@]}" -O0 -include "$emulator/device.h" -x c++ -c "$source" -o "$object.names.o"
    names=$(nm --defined-only -g "$object.names.o" | awk '$2 == "T" && $3 !~ /^_Z/ { print $3 }')
    rm "$object.names.o"
    # Each source is a module of its own on a GPU, so two sources may define the same helper:
    # here each is wrapped in an unnamed namespace, its kernels registered from inside the
    # translation unit. The system headers its directory includes come first, outside it.
    {
        echo "#include \"device.h\""
        echo "#include \"launch.h\""
        cat "$(dirname "$source")"/*.cu* | grep -h '^#include <' | sort -u
        echo "#define EMU_SOURCE \"$origin/$(basename "$source" .cu)\""
        echo "namespace {"
        echo "#include \"$source\""
        echo "}"
        for name in $names; do echo "EMU_REGISTER($name)"; done
    } >"$object.cpp"
    # Kernels of the same name in two sources are told apart by their source (launch.h).
    "${cxx[@]}" -O2 -c "$object.cpp" -o "$object.global.o"
    objcopy $(for name in $names; do echo "--localize-symbol=$name"; done) "$object.global.o" "$object"
    rm "$object.global.o"
}
pids=()
for source in "${sources[@]}"; do
    origin=peagle
    [[ $source == "$candle_kernels"/* ]] && origin=candle
    object=$out/obj/kernels-$origin-$(basename "$source" .cu).o
    compile "$source" "$object" "$origin" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$(nproc)" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for pid in "${pids[@]}"; do wait "$pid"; done

# stubs LIBRARY SOURCE... : every function cudarc declares for LIBRARY that SOURCEs do not
# define, failing with a line that names it, so that a binary resolves all it imports.
stubs() {
    local bindings=$1
    shift
    local defined
    defined=$(for o in "$@"; do nm --defined-only -g "$o"; done | awk '{ print $3 }' | sort -u)
    {
        echo '#include <stdio.h>'
        echo 'static int unsupported(const char* name) { fprintf(stderr, "peagle CUDA emulator: %s is not emulated\n", name); return 801; }'
        grep -oh 'pub unsafe fn [A-Za-z0-9_]*' "$cudarc/$bindings/sys/mod.rs" | awk '{ print $4 }' | sort -u |
            comm -23 - <(echo "$defined") | awk '{ print "int " $1 "(void) { return unsupported(\"" $1 "\"); }" }'
    }
}
library() { # NAME SONAME BINDINGS SOURCE...
    local name=$1 soname=$2 bindings=$3 objects=()
    shift 3
    for source in "$@"; do
        case $source in
        *.o) objects+=("$source") ;;
        *) "${cxx[@]}" -O2 -c "$emulator/$source" -o "$out/obj/$source.o" && objects+=("$out/obj/$source.o") ;;
        esac
    done
    stubs "$bindings" "${objects[@]}" >"$out/obj/$name-stubs.c"
    gcc -O2 -fPIC -c "$out/obj/$name-stubs.c" -o "$out/obj/$name-stubs.o"
    # Linked beside, then renamed: a process running on the library keeps the one it loaded.
    g++ -shared -Wl,-soname,"$soname" -o "$out/lib/$soname.new" "${objects[@]}" "$out/obj/$name-stubs.o"
    mv "$out/lib/$soname.new" "$out/lib/$soname"
}
library cuda libcuda.so.1 driver driver.cpp graph.cpp fibers.cpp memory.cpp "$out"/obj/kernels-*.o
library cublas libcublas.so.13 cublas cublas.cpp
library curand libcurand.so.10 curand curand.cpp
# The emulator's own tests, on its sources rather than the libraries, with its test kernels.
"${cxx[@]}" -O1 "$emulator/self_test.cpp" "$emulator/driver.cpp" "$emulator/graph.cpp" "$emulator/fibers.cpp" "$emulator/memory.cpp" \
    -o "$out/self_test"
"$out/self_test"
echo "CUDA emulator: $out/lib"

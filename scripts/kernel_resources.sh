#!/usr/bin/env bash
# Each CUDA kernel's registers and spills, as the GPU hosts' driver compiles our PTX for an
# A100, an H100/H200 and a B200 (sm_80, sm_90, sm_100: the architectures build.rs writes PTX
# for), by ptxas from the pinned toolkit (scripts/build_cuda.sh installs it), over the PTX the
# CUDA build check wrote where it is fresh, else compiled from the sources; no GPU needed.
#   scripts/kernel_resources.sh [--check]   the table (scripts/kernel_resources.py); with
#                                           --check it fails where a kernel spills more than
#                                           its limit below: 0 bytes but for those listed
# Lower or drop a limit when a change takes a kernel's spills off; never raise one to land a
# change to a kernel that runs by default (the tensor-core matmuls, attention, the norms).
set -euo pipefail
cd "$(dirname "$0")/.."
limits=()
if [ "${1:-}" = --check ]; then
    # Bytes spilled (stores and loads) on the worst architecture. All are the CUDA-core
    # fallbacks (PEAGLE_CUDA_MATMUL=fma) or f32 activations, off the default path.
    limits=(--check --at-most linear_f32_f32_row=24 --at-most moe_gate_up_bf16=24)
fi
cuda_bin=$PWD/.cuda/toolkit/nvidia/cu13/bin
[ -x "$cuda_bin/nvcc" ] || bash scripts/build_cuda.sh --toolkit
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The PTX the CUDA build check wrote (scripts/build_cuda.sh --check), where each kernel's is
# newer than its source and the headers: ptxas alone then, as the driver compiles that PTX,
# without compiling the sources again. Otherwise from the sources.
ptx_dir=$(cat target/cuda-check/kernels_ptx_dir.txt 2>/dev/null || true)
fresh_ptx() {
    local source stem arch header
    [ -n "$ptx_dir" ] || return 1
    for source in kernels/*.cu; do
        stem=$(basename "$source" .cu)
        for arch in 80 90 100; do
            [ "$ptx_dir/$stem.compute_$arch.ptx" -nt "$source" ] || return 1
            for header in kernels/*.cuh; do
                [ "$ptx_dir/$stem.compute_$arch.ptx" -nt "$header" ] || return 1
            done
        done
    done
}
if fresh_ptx; then
    for source in kernels/*.cu; do
        for arch in 80 90 100; do
            "$cuda_bin/ptxas" -arch=sm_$arch -O3 -v -o "$out/kernel.cubin" \
                "$ptx_dir/$(basename "$source" .cu).compute_$arch.ptx" 2>&1 ||
                { cat "$out/ptxas.txt" >&2; echo "ptxas failed on $source for sm_$arch" >&2; exit 1; }
        done
    done >"$out/ptxas.txt"
else
    for source in kernels/*.cu; do
        # The flags build.rs compiles with, to machine code for each architecture at once.
        "$cuda_bin/nvcc" -fatbin -O3 -std=c++17 -gencode arch=compute_80,code=sm_80 \
            -gencode arch=compute_90,code=sm_90 -gencode arch=compute_100,code=sm_100 -Xptxas -v \
            -o "$out/kernel.fatbin" "$source" 2>&1 ||
            { cat "$out/ptxas.txt" >&2; echo "nvcc failed on $source" >&2; exit 1; }
    done >"$out/ptxas.txt"
fi
python3 scripts/kernel_resources.py ${limits[@]+"${limits[@]}"} <"$out/ptxas.txt"

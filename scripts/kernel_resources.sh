#!/usr/bin/env bash
# Each CUDA kernel's registers and spills, as the GPU hosts' driver compiles our PTX for an
# A100, an H100/H200 and a B200 (sm_80, sm_90, sm_100: the architectures build.rs writes PTX
# for), by ptxas from the pinned toolkit (scripts/build_cuda.sh installs it); no GPU needed.
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
nvcc=$PWD/.cuda/toolkit/nvidia/cu13/bin/nvcc
[ -x "$nvcc" ] || bash scripts/build_cuda.sh --toolkit
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for source in kernels/*.cu; do
    # The flags build.rs compiles with, to machine code for each architecture at once.
    "$nvcc" -fatbin -O3 -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
        -gencode arch=compute_100,code=sm_100 -Xptxas -v -o "$out/kernel.fatbin" "$source" 2>&1 ||
        { cat "$out/ptxas.txt" >&2; echo "nvcc failed on $source" >&2; exit 1; }
done >"$out/ptxas.txt"
python3 scripts/kernel_resources.py ${limits[@]+"${limits[@]}"} <"$out/ptxas.txt"

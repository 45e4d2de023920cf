#!/usr/bin/env bash
# Builds peagle-serve, peagle-generate, peagle-train and the GPU test binaries with the cuda
# feature, ready to carry to a GPU host, on a machine with no GPU and nothing installed by hand:
#   1. the CUDA 13.0 toolkit from PyPI under .cuda/toolkit (git-ignored), if missing. 13.0 is
#      pinned because GPU hosts run driver 580, which JIT-compiles PTX of ISA 9.0 and older only;
#   2. link-time stubs of libcuda, cuBLAS, cuBLASLt, cuRAND and NVRTC, which the real libraries
#      on the GPU host replace at run time (scripts/gpu_check.sh finds them);
#   3. the build in the gpu-pack profile (Cargo.toml: release code, link-time optimized, which
#      leaves out what a binary never calls), and the binaries, stripped, packed for carrying
#      in one file,
#      target/gpu/binaries.tar.xz (the GPU test binaries, peagle-serve, peagle-generate,
#      peagle-bench, the timers of the matmul against cuBLAS, the experts and paged attention,
#      and scripts/graph_memcheck_probe.cu),
#      to carry beside the repository (xz with a dictionary wider than the binaries, which
#      share most of their bytes), and in two smaller ones for when that one and the working
#      tree are over a host's 64 MiB: target/gpu/tests.tar.xz (gpu_check.sh's tests part) and
#      target/gpu/bench.tar.xz (its other parts). scripts/gpu_check.sh unpacks whichever it is
#      given into target/carry/ with Python's tarfile, which every GPU host has.
#   scripts/build_cuda.sh --check   the CUDA build check, what CI runs: the crates with CUDA
#                                   code (kernels, models, engine: libraries, tests, examples)
#                                   and peagle-cli (its tests, and so its binaries) built with the
#                                   cuda feature, which checks every line of it, and peagle's
#                                   kernels compiled to PTX (their directory named in
#                                   target/cuda-check/kernels_ptx_dir.txt, where
#                                   scripts/kernel_resources.sh reads them), in
#                                   target/cuda-check; no packing, candle's own kernels compiled
#                                   from empty sources, and the GPU test binaries, listed in
#                                   target/cuda-check/gpu_tests.txt, and peagle-generate built for
#                                   the CUDA emulator (scripts/emulated_gpu_tests.sh,
#                                   scripts/emulated_host_ops.sh)
#   scripts/build_cuda.sh --serve   builds target/release/peagle-serve only, with the cuda
#                                   feature (what the Dockerfile runs)
#   scripts/build_cuda.sh --toolkit installs the toolkit and the stubs only
# CUDA_COMPUTE_CAP (default 80) picks the architecture candle's own kernels are built for: 80
# gives PTX for compute 8.0, which the driver JIT-compiles for an H100 or a B200 alike, while
# 90 or 100 give PTX for sm_90a or sm_100a, which no other GPU loads. peagle's kernels are PTX
# for compute 8.0, 9.0 and 10.0 whatever it says.
set -euo pipefail
cd "$(dirname "$0")/.."
check=${1:-}

toolkit=$PWD/.cuda/toolkit
cuda_root=$toolkit/nvidia/cu13
if [ ! -x "$cuda_root/bin/nvcc" ]; then
    echo "installing the CUDA 13.0 toolkit into $toolkit"
    python3 -m pip install -q --no-deps --target "$toolkit" \
        "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" \
        "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*"
fi
export PATH=$cuda_root/bin:$PATH CUDA_ROOT=$cuda_root CUDARC_CUDA_VERSION=13000
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-80}
target=$PWD/target

# Beside the runtime in $CUDA_ROOT/lib, a directory cudarc's build script always searches.
stubs=$cuda_root/lib
if [ ! -e "$stubs/libcuda.so" ]; then
    cudarc=$(bash scripts/package_dir.sh cudarc)
    # Library, soname on the GPU host, and the cudarc bindings that declare its functions.
    for lib in "cuda libcuda.so.1 driver" "cublas libcublas.so.13 cublas" "cublasLt libcublasLt.so.13 cublaslt" \
        "curand libcurand.so.10 curand" "nvrtc libnvrtc.so.13 nvrtc"; do
        set -- $lib
        grep -oh 'pub unsafe fn [A-Za-z0-9_]*' "$cudarc/src/$3/sys/mod.rs" | sort -u |
            awk '{ print "void " $4 "(void) {}" }' >"$stubs/$1.c"
        gcc -shared -fPIC -Wl,-soname,"$2" -o "$stubs/lib$1.so" "$stubs/$1.c"
        rm "$stubs/$1.c"
    done
    # candle-kernels links the runtime by its unversioned name, which the wheel lacks.
    ln -sf libcudart.so.13 "$stubs/libcudart.so"
fi

[ "$check" = --toolkit ] && exit 0

# Every build compiles some of candle-kernels' sources from empty files (scripts/nvcc_skipping.sh).
# The full build skips its GGUF and MoE kernels, which candle links statically into every binary
# (32 MB of fatbin, registered with the driver at start-up) and peagle never calls: its MoE runs
# its own kernels. Their launchers are then undefined, which links because their only callers
# sit in functions the linker drops as unreachable; were peagle to call one, the link would fail.
export REAL_NVCC=$cuda_root/bin/nvcc NVCC=$PWD/scripts/nvcc_skipping.sh
export SKIPPED_SOURCES='*/candle-kernels-*/src/@(moe/*|mmq_gguf/*|mmvq_gguf.cu)'
# cudaforge's incremental cache knows sources and flags but not which nvcc compiled them: without
# it, a build script rerun by a change of NVCC recompiles everything. A change of SKIPPED_SOURCES
# alone reruns nothing: follow it with `cargo clean --release -p candle-kernels`.
rm -f "$target"/*/build/candle-kernels-*/out/.cudaforge_cache.json

if [ "$check" = --serve ]; then
    cargo build --release --locked --features peagle-cli/cuda --bin peagle-serve
    exit 0
fi

# gpu_tests PROFILE [CARGO_ARGUMENT...]: builds the GPU tests of the crates with CUDA code with
# their cuda features in PROFILE (and whatever else the arguments add), lists the GPU test
# binaries, one "crate path" a line, and writes the directory of peagle's kernels' PTX to
# kernels_ptx_dir.txt in the target directory, and the unit test binary of peagle-kernels'
# library where the arguments build it (--lib) to lib_tests.txt there, in the same form.
gpu_tests() {
    local profile=$1
    shift
    local dir=${CARGO_TARGET_DIR:-$target}
    cargo test --profile "$profile" --locked --features peagle-kernels/cuda,peagle-models/cuda,peagle-engine/cuda \
        -p peagle-kernels -p peagle-models -p peagle-engine --test gpu --no-run --message-format json "$@" |
        python3 -c '
import json, sys
with open(sys.argv[2], "w") as libs:
    for line in sys.stdin:
        m = json.loads(line)
        crate = m.get("manifest_path", "").split("/")[-2:-1]
        if m.get("reason") == "compiler-artifact" and m.get("executable"):
            if m["target"]["name"] == "gpu":
                print(crate[0], m["executable"])
            elif m["target"]["kind"] == ["lib"] and crate[0] == "peagle-kernels":
                libs.write(crate[0] + " " + m["executable"] + "\n")
        if m.get("reason") == "build-script-executed" and "/peagle-kernels#" in m["package_id"]:
            open(sys.argv[1], "w").write(m["out_dir"] + "\n")
' "$dir/kernels_ptx_dir.txt" "$dir/lib_tests.txt"
}

if [ "$check" = --check ]; then
    # The emulator runs peagle's kernels and candle's from their sources, and no binary built
    # here carries candle's empty PTX elsewhere: in a target directory of its own. Optimized
    # lightly and without debug info: the build is most of the check's time, while the tests'
    # host code is little of theirs.
    export SKIPPED_SOURCES='*/candle-kernels-*/*.cu' CARGO_TARGET_DIR=$target/cuda-check
    mkdir -p "$CARGO_TARGET_DIR"
    light=(--config profile.release.opt-level=1 --config profile.release.debug=false)
    # peagle-cli in the same build: its binaries then share the dependencies' features with
    # the tests, where a build of their own recompiled most of the dependencies.
    gpu_tests release --lib --tests --examples -p peagle-cli --features peagle-cli/cuda "${light[@]}" \
        >"$CARGO_TARGET_DIR/gpu_tests.txt"
    echo "CUDA build check: ok"
    exit 0
fi

# The carried binaries in the gpu-pack profile (Cargo.toml): release code, smaller.
cargo build --profile gpu-pack --locked --features peagle-cli/cuda,peagle-train/cuda \
    -p peagle-cli -p peagle-train -p peagle-bench
cargo build --profile gpu-pack --locked --features peagle-kernels/cuda -p peagle-kernels --example gemm_vs_cublas \
    --example moe_experts --example paged_attention
gpu_tests gpu-pack >"$target/gpu_tests.txt"

carry=$target/carry
rm -rf "$carry" && mkdir -p "$carry"
cp "$target"/gpu-pack/{peagle-serve,peagle-generate,peagle-bench} "$carry/"
cp "$target/gpu-pack/examples/gemm_vs_cublas" "$carry/peagle-gemm-vs-cublas"
cp "$target/gpu-pack/examples/moe_experts" "$carry/peagle-moe-experts"
cp "$target/gpu-pack/examples/paged_attention" "$carry/peagle-paged-attention"
# PTX for compute 8.0 and the CUDA runtime linked statically: it needs only the host's driver.
nvcc -O2 -std=c++17 -gencode arch=compute_80,code=compute_80 -L"$cuda_root/lib" \
    -o "$carry/peagle-graph-memcheck-probe" scripts/graph_memcheck_probe.cu
while read -r crate exe; do cp "$exe" "$carry/gpu-$crate"; done <"$target/gpu_tests.txt"
strip --strip-all "$carry"/peagle-* "$carry"/gpu-*
# The test binaries read the repository's models at this path; gpu_check.sh links it.
echo "$PWD" >"$carry/BUILD_ROOT"
rm -rf "$target/gpu" && mkdir -p "$target/gpu"
# pack NAME PATTERN...: the files of target/carry that the PATTERNs name, with BUILD_ROOT, in
# target/gpu/NAME.tar.xz.
pack() {
    local name=$1
    shift
    # shellcheck disable=SC2068 # the patterns match in target/carry
    (cd "$carry" && tar cf - BUILD_ROOT $@ | xz -9e --lzma2=preset=9e,dict=512MiB -T1 >"$target/gpu/$name.tar.xz")
}
# Every binary in one pack, and the same binaries in two, for when one pack and the working
# tree do not fit a host together: the tests' part, and the other parts' (one command each).
pack binaries 'gpu-*' 'peagle-*'
pack tests 'gpu-*' peagle-graph-memcheck-probe
pack bench peagle-serve peagle-generate peagle-bench peagle-gemm-vs-cublas peagle-moe-experts peagle-paged-attention
# What travels to a GPU host with a pack: the working tree, tracked files and the untracked
# ones git does not ignore. Hosts lent for a few minutes take 64 MiB at most, counted as the
# disk holds the files, each in whole blocks of 4 KiB: a tree and pack of 63.8 MiB by their bytes
# and 65.5 MiB by their blocks were refused. Where not even the split packs fit, none can be
# carried, so this fails.
blocks() { xargs -0 stat -c %s | awk '{ n += int(($1 + 4095) / 4096) * 4096 } END { print n + 0 }'; }
tree=$({ git ls-files -z && git ls-files -z -o --exclude-standard; } | blocks)
fits=1
for name in binaries tests bench; do
    size=$(printf '%s\0' "$target/gpu/$name.tar.xz" | blocks)
    left=$(((64 << 20) - size - tree))
    echo "target/gpu/$name.tar.xz: $((size / 1024)) KiB; with the working tree, $((left / 1024)) KiB left under 64 MiB"
    [ "$name" = binaries ] || [ "$left" -ge 0 ] || fits=0
done
if [ $fits -eq 0 ]; then
    echo "build_cuda.sh: a pack and the working tree are over 64 MiB together: a GPU host cannot take them" >&2
    exit 1
fi

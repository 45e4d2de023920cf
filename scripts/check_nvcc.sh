#!/usr/bin/env bash
# The nvcc of `scripts/build_cuda.sh --check`, which sets NVCC to this script and its own
# target directory. cargo check links nothing and runs nothing, so the check never uses the PTX
# and objects of candle's own kernels (candle-kernels: third-party, pinned by Cargo.lock), and
# compiling them was most of the check's time. A source of candle-kernels is therefore compiled
# from an empty file of the same name, which gives the outputs its build script expects; every
# other source, peagle's kernels/ included, goes to the real nvcc unchanged. The full build
# (scripts/build_cuda.sh without --check) compiles candle's kernels for real.
set -euo pipefail
real=${REAL_NVCC:?"REAL_NVCC, the real nvcc, is not set (scripts/build_cuda.sh --check sets it)"}
args=("$@")
if [ ${#args[@]} -gt 0 ]; then
    last=$((${#args[@]} - 1))
    source=$(realpath -m -- "${args[$last]}")
    case $source in
    */candle-kernels-*/*.cu)
        empty=$(mktemp -d)
        trap 'rm -rf "$empty"' EXIT
        : >"$empty/${source##*/}"
        args[$last]=$empty/${source##*/}
        ;;
    esac
fi
"$real" "${args[@]}"

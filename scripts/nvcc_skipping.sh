#!/usr/bin/env bash
# The nvcc that scripts/build_cuda.sh gives cargo (as NVCC). A source whose absolute path
# matches SKIPPED_SOURCES, a bash extglob pattern, is compiled from an empty file of the same
# name, which gives the outputs a build script expects and defines nothing; every other source,
# peagle's kernels/ included, goes to the real nvcc (REAL_NVCC) unchanged. build_cuda.sh says
# which of candle-kernels' sources (third-party, pinned by Cargo.lock) each build skips and why.
set -euo pipefail
shopt -s extglob
real=${REAL_NVCC:?"REAL_NVCC, the real nvcc, is not set (scripts/build_cuda.sh sets it)"}
skipped=${SKIPPED_SOURCES:?"SKIPPED_SOURCES is not set (scripts/build_cuda.sh sets it)"}
args=("$@")
if [ ${#args[@]} -gt 0 ]; then
    last=$((${#args[@]} - 1))
    source=$(realpath -m -- "${args[$last]}")
    # shellcheck disable=SC2254 # the pattern is meant to match, not to be quoted
    case $source in
    $skipped)
        empty=$(mktemp -d)
        trap 'rm -rf "$empty"' EXIT
        : >"$empty/${source##*/}"
        args[last]=$empty/${source##*/}
        ;;
    esac
fi
"$real" "${args[@]}"

#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run): the Rust tests, the official openai client
# against a real peagle-serve, and the CUDA build (scripts/build_cuda.sh --check: compiled and
# linked against stubs, not run, so no GPU is needed; scripts/gpu_check.sh runs the GPU tests on
# a GPU host). The CUDA build runs beside the CPU tests: its longest part, candle's CUDA kernels,
# is one nvcc process at a time.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p target
bash scripts/build_cuda.sh --check >target/cuda-check.log 2>&1 &
cuda=$!
if ! { cargo test --workspace --locked && bash scripts/openai_client_test.sh; }; then
    kill "$cuda" 2>/dev/null
    exit 1
fi
if ! wait "$cuda"; then
    tail -40 target/cuda-check.log
    echo "the CUDA build failed; its log is target/cuda-check.log"
    exit 1
fi
echo "CUDA build (scripts/build_cuda.sh --check): ok"

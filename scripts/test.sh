#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run): the Rust tests, each benchmark run once, the
# official openai client against a real peagle-serve, Schemathesis fuzzing it against its
# /openapi.json (scripts/fuzz_api.sh), the Kubernetes manifests validated offline
# (scripts/validate_manifests.sh), three replicas behind vllm-router (scripts/scaleout_test.sh:
# routing, prefix-cache affinity, failover), and the CUDA build check (scripts/build_cuda.sh
# --check: the crates with CUDA code built with the cuda feature, the CUDA kernels compiled to PTX;
# no GPU needed, scripts/gpu_check.sh runs the GPU tests on a GPU host), with the GPU report's
# assembly over made-up results (scripts/gpu_report_test.py), the count of a step's host operations
# over a made-up emulator trace (scripts/host_ops_test.py), each kernel's spills by ptxas held to
# their limits (scripts/kernel_resources.sh --check, its parsing tested by
# scripts/kernel_resources_test.py), the tensor-core kernels' operand layout
# simulated (scripts/mma_layout_test.py), and the kernels' and the models' GPU tests on the CUDA
# emulator (scripts/emulated_gpu_tests.sh, cuda-emulator/: every kernel against its CPU reference,
# the fixture models' logits, batch invariance and CUDA graphs on both matmuls, and the CUDA
# code's unit tests, with no GPU;
# gpt-oss's full-size experts test and the engine's tests, minutes to an hour there, are left to GPU
# hosts and to the emulator's own runs), then a decode step's host operations and driver calls, by
# CUDA graphs and without, counted there against their limits (scripts/emulated_host_ops.sh --check). The check and the emulated runs
# go beside the CPU tests, in a target directory of their own.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p target
# timed COMMAND...: runs COMMAND, then prints how long it took, to find where CI's time goes.
timed() {
    local start=$SECONDS code
    "$@"
    code=$?
    echo "timed: $* took $((SECONDS - start)) s (exit $code)"
    return $code
}
# Left out on the emulator, for CI's time: the full-size experts test (minutes there), and the
# long-context rows test on the CUDA-core matmul, whose subject (attention split over parts of a
# long row) is the same code on either matmul, while that matmul's batch invariance is the
# window-rows test's and the kernels' matmul test's.
emulated_skip="experts::mxfp4_experts_match_the_reference_and_are_batch_invariant
    peagle-models-fma:rows_past_1024_positions_equal_single_token_steps_bitwise_on_the_gpu"
{
    timed bash scripts/build_cuda.sh --check || exit 1
    # The spills' check beside the emulated tests: both need only the build, and each keeps one
    # core busy (ptxas, then one test at a time), where the CPU suite often ends first.
    timed bash scripts/kernel_resources.sh --check >target/kernel-resources.log 2>&1 &
    resources=$!
    EMULATED_CRATES="peagle-kernels peagle-models" \
        EMULATED_SKIP="$emulated_skip" TEST_TIMEOUT=600 timed bash scripts/emulated_gpu_tests.sh
    emulated=$?
    wait "$resources"
    spills=$?
    cat target/kernel-resources.log
    [ $emulated -eq 0 ] && [ $spills -eq 0 ] && timed bash scripts/emulated_host_ops.sh --check
} >target/cuda-check.log 2>&1 &
cuda=$!
# The benchmarks run once each (criterion's test mode), so that one broken by a change fails here
# rather than when someone next measures; selected across the workspace, so that they build with
# the features the tests did (`-p peagle-benches` alone would rebuild candle and its dependencies).
if ! { timed cargo test --workspace --locked && timed cargo test --workspace --locked --bench '*' \
    && python3 scripts/gpu_report_test.py && python3 scripts/host_ops_test.py \
    && python3 scripts/kernel_resources_test.py \
    && python3 scripts/mma_layout_test.py \
    && timed bash scripts/openai_client_test.sh \
    && timed bash scripts/fuzz_api.sh && timed bash scripts/validate_manifests.sh \
    && timed bash scripts/scaleout_test.sh; }; then
    kill "$cuda" 2>/dev/null
    exit 1
fi
if ! wait "$cuda"; then
    tail -40 target/cuda-check.log
    echo "the CUDA build check or the emulated GPU tests failed; the log is target/cuda-check.log"
    exit 1
fi
grep -E "^emulated GPU tests|^timed: " target/cuda-check.log
grep "^| target/cuda-emulator/host-ops" target/cuda-check.log
echo "CUDA build check (scripts/build_cuda.sh --check), the kernels' spills, the kernels' and models' emulated GPU tests, and a step's host operations: ok"

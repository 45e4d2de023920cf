#!/usr/bin/env bash
# The GPU tests without a GPU: every test of the GPU test binaries, each in a process of its
# own, on the CUDA emulator (cuda-emulator/README.md), which runs peagle's kernels and
# candle's on the host. It proves what a kernel computes, a launcher's shapes, bounds and
# graph captures, not speed, nor a GPU's own rounding (see the README); scripts/gpu_check.sh
# on a GPU host proves the rest.
#   scripts/emulated_gpu_tests.sh [FILTER...]   the tests whose names contain a FILTER (all
#                                               without one)
# EMULATED_CRATES="CRATE..." keeps to the GPU tests of those crates (default peagle-kernels,
# peagle-models and peagle-engine); EMULATED_SKIP="NAME..." leaves out tests by name, or by
# LABEL:NAME from one run alone (LABEL as the lines print it: peagle-models-fma, say);
# TEST_TIMEOUT (default 3600) bounds each: the engine's demo-model tests take over 20 minutes
# each on the emulator.
# The models' and the engine's tests run again on the CUDA-core matmul (PEAGLE_CUDA_MATMUL=fma),
# as on a GPU host. Each test runs in a process of its own (scripts/gpu_test_lib.sh); logs in
# target/cuda-emulator/tests/CRATE[-fma]/. Then peagle-kernels' `cuda::` unit tests, where no
# filter is given.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/build_cuda_emulator.sh || exit 1
bash scripts/build_cuda.sh --check || exit 1
export LD_LIBRARY_PATH=$PWD/target/cuda-emulator/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
logs=target/cuda-emulator/tests
rm -rf "$logs" && mkdir -p "$logs"
source scripts/gpu_test_lib.sh
export TEST_TIMEOUT=${TEST_TIMEOUT:-3600}
filters=("$@")
gpu_test_wanted() {
    local name=$1 f
    for f in ${EMULATED_SKIP:-}; do
        if [ "$name" = "$f" ] || [ "$label:$name" = "$f" ]; then return 1; fi
    done
    [ ${#filters[@]} -eq 0 ] && return 0
    for f in "${filters[@]}"; do [[ $name == *"$f"* ]] && return 0; done
    return 1
}
passed=0 failed=0
# run LABEL BINARY [VAR=VALUE...]: the wanted tests of BINARY, counted.
label=
run() {
    label=$1
    run_gpu_tests "$2" "$1" "$logs" "${@:3}"
    passed=$((passed + gpu_tests_passed)) failed=$((failed + ${#gpu_tests_failed[@]}))
}
mapfile -t binaries <target/cuda-check/gpu_tests.txt
for line in "${binaries[@]}"; do
    read -r crate binary <<<"$line"
    [[ " ${EMULATED_CRATES:-$crate} " == *" $crate "* ]] || continue
    run "$crate" "$binary"
    [ "$crate" = peagle-kernels ] || run "$crate-fma" "$binary" PEAGLE_CUDA_MATMUL=fma
done
# peagle-kernels' CUDA code's own unit tests (`cuda::`: launch shapes, the choice of a
# kernel), which only a cuda build compiles and no device runs, in one process, where no
# filter asks for others; at least one must run.
if [ ${#filters[@]} -eq 0 ]; then
    while read -r crate binary; do
        [[ " ${EMULATED_CRATES:-$crate} " == *" $crate "* ]] || continue
        log=$logs/$crate-lib-cuda.log
        ran=0
        "$binary" cuda:: --test-threads=1 >"$log" 2>&1 && ran=$(grep -c '^test .* ok$' "$log")
        if [ "$ran" -gt 0 ]; then
            echo "ok      $crate lib cuda:: ($ran tests)"
            passed=$((passed + 1))
        else
            echo "FAILED  $crate lib cuda:: : $log"
            failed=$((failed + 1))
        fi
    done <target/cuda-check/lib_tests.txt
fi
echo "emulated GPU tests: $passed passed, $failed failed"
[ $failed -eq 0 ]

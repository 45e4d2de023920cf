#!/usr/bin/env bash
# The GPU tests without a GPU: every test of the GPU test binaries, each in a process of its
# own, on the CUDA emulator (kernels/emulator/README.md), which runs peagle's kernels and
# candle's on the host. It proves what a kernel computes, a launcher's shapes, bounds and
# graph captures, not speed, nor a GPU's own rounding (see the README); scripts/gpu_check.sh
# on a GPU host proves the rest.
#   scripts/emulated_gpu_tests.sh [FILTER...]   the tests whose names contain a FILTER (all
#                                               without one)
# EMULATED_CRATES="CRATE..." keeps to the GPU tests of those crates (default peagle-kernels,
# peagle-models and peagle-engine); EMULATED_SKIP="NAME..." leaves out tests by name;
# TEST_TIMEOUT (default 900) bounds each.
# The models' and the engine's tests run again on the tensor-core matmul (PEAGLE_CUDA_MATMUL=mma),
# as on a GPU host. Logs: target/cuda-emulator/tests/.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/build_cuda_emulator.sh || exit 1
bash scripts/build_cuda.sh --emulated ${EMULATED_CRATES:-} || exit 1
export LD_LIBRARY_PATH=$PWD/target/cuda-emulator/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
logs=target/cuda-emulator/tests
rm -rf "$logs" && mkdir -p "$logs"
filters=("$@")
wanted() {
    local name=$1 f
    for f in ${EMULATED_SKIP:-}; do [ "$name" = "$f" ] && return 1; done
    [ ${#filters[@]} -eq 0 ] && return 0
    for f in "${filters[@]}"; do [[ $name == *"$f"* ]] && return 0; done
    return 1
}
passed=0 failed=()
# run CRATE BINARY [ENV...]: each wanted test of BINARY in a process of its own.
run() {
    local crate=$1 binary=$2 name log start
    shift 2
    while read -r name; do
        wanted "$name" || continue
        log=$logs/$crate${1:+-mma}-$name.log
        start=$(date +%s)
        if env "$@" timeout "${TEST_TIMEOUT:-900}" "$binary" --exact "$name" --test-threads=1 --nocapture >"$log" 2>&1; then
            passed=$((passed + 1))
            echo "ok      $crate${1:+ (mma)} $name ($(($(date +%s) - start)) s)"
        else
            failed+=("$crate${1:+ (mma)} $name")
            echo "FAILED  $crate${1:+ (mma)} $name ($(($(date +%s) - start)) s): $log"
            grep -hE "peagle CUDA emulator|panicked|^thread" "$log" | head -3 | sed 's/^/        /'
        fi
    done < <("$binary" --list 2>/dev/null | sed -n 's/: test$//p')
}
mapfile -t binaries <target/cuda-check/gpu_tests.txt
for line in "${binaries[@]}"; do
    read -r crate binary <<<"$line"
    run "$crate" "$binary"
    [ "$crate" = peagle-kernels ] || run "$crate" "$binary" PEAGLE_CUDA_MATMUL=mma
done
echo "emulated GPU tests: $passed passed, ${#failed[@]} failed"
[ ${#failed[@]} -eq 0 ]

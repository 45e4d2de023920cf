# Runs the tests of a GPU test binary one a process; sourced by scripts/gpu_check.sh (on a GPU
# host) and scripts/emulated_gpu_tests.sh (on the CUDA emulator).
#
# run_gpu_tests BINARY LABEL LOGS [VAR=VALUE...]: every test of BINARY that gpu_test_wanted
# accepts, each in a process of its own with the VARs in its environment: a CUDA error such as an
# illegal address ends its process's context, and would fail every test after it in a shared
# one. Each runs under TEST_TIMEOUT seconds (default 120); where GPU_TESTS_DEADLINE (seconds
# since the epoch) is set, none runs past it and none starts with under 30 s to go.
# A test that says it was skipped for want of a device fails: it passed without running; so
# does a binary that lists no tests.
# Prints a line a test and keeps its output in LOGS/LABEL/TEST.log. Sets gpu_tests_passed and
# gpu_tests_unrun (counts; unrun: out of time), gpu_tests_failed and gpu_tests_faulted (names;
# faulted: failed by a CUDA error or a crash, rather than an assertion or its time running out,
# which memcheck, many times slower, could only run out of again).

# gpu_test_wanted NAME: whether to run the test NAME; a caller may define its own.
gpu_test_wanted() { return 0; }

# The limit for the next test in seconds, or nothing when it may not start.
gpu_test_limit() {
    local limit=${TEST_TIMEOUT:-120} left
    if [ -n "${GPU_TESTS_DEADLINE:-}" ]; then
        left=$((GPU_TESTS_DEADLINE - $(date +%s)))
        [ $left -ge 30 ] || return 0
        [ $left -ge "$limit" ] || limit=$left
    fi
    echo "$limit"
}

run_gpu_tests() {
    local binary=$1 label=$2 logs=$3/$2 name log limit start code listed=0
    shift 3
    gpu_tests_passed=0 gpu_tests_unrun=0 gpu_tests_failed=() gpu_tests_faulted=()
    mkdir -p "$logs"
    while read -r name; do
        listed=$((listed + 1))
        gpu_test_wanted "$name" || continue
        limit=$(gpu_test_limit)
        if [ -z "$limit" ]; then
            gpu_tests_unrun=$((gpu_tests_unrun + 1))
            continue
        fi
        log=$logs/$name.log start=$(date +%s)
        env "$@" timeout --kill-after=10 "$limit" "$binary" --exact "$name" --test-threads=1 --nocapture \
            >"$log" 2>&1
        code=$?
        if [ $code -eq 0 ] && ! grep -q "^skipped: " "$log"; then
            gpu_tests_passed=$((gpu_tests_passed + 1))
            echo "ok      $label $name ($(($(date +%s) - start)) s)"
            continue
        fi
        gpu_tests_failed+=("$name")
        if [ $code -eq 124 ] || [ $code -eq 137 ]; then
            echo "        (out of its $limit s)" >>"$log"
        elif grep -qE "CUDA_ERROR|DriverError|illegal|misaligned|^peagle CUDA emulator" "$log" ||
            ! grep -q "^test result" "$log"; then
            gpu_tests_faulted+=("$name")
        fi
        echo "FAILED  $label $name ($(($(date +%s) - start)) s): $log"
        grep -hE "^peagle CUDA emulator|^skipped: |panicked|^thread" "$log" | head -3 | sed 's/^/        /'
    done < <("$binary" --list 2>"$logs/list.log" | sed -n 's/: test$//p')
    if [ $listed -eq 0 ]; then
        gpu_tests_failed+=("(the list of tests)")
        echo "FAILED  $label lists no tests: $logs/list.log"
    fi
}

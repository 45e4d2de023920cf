#!/usr/bin/env bash
# Scale-out check on loopback: three peagle-serve replicas (the bundled demo model) behind
# vllm-router, driven by scripts/scaleout_test.py with the official `openai` package:
#   1. cache_aware router: 60 requests in prefix-sharing groups; all succeed, every replica
#      serves some, each group stays on one replica; the prefix-cache hit rate is recorded;
#   2. round_robin router: the same workload with fresh prompts, for the hit-rate baseline;
#   3. cache_aware router again: one replica is SIGKILLed while it has requests running; no
#      request may fail except streams already flowing from it, which must fail loudly and
#      succeed when sent again (a proxy cannot resume a stream its replica took down with it);
#   4. another replica gets SIGTERM (a rolling update) mid-run: it drains, and no request fails;
#   5. a summary (distribution, failover, hit rates) to paste into a note.
# Needs the built binary (scripts/openai_client_test.sh builds it); installs vllm-router from
# scripts/requirements.txt if missing. Exits non-zero if any check fails. About a minute on two
# CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/serve_lib.sh
started=$SECONDS

# The pinned versions: the router's flags and behaviour are what this test was written against.
pip_pinned openai vllm-router
serve="${CARGO_TARGET_DIR:-target}/debug/peagle-serve"
[ -x "$serve" ] || { echo "scaleout_test.sh: $serve is not built (scripts/openai_client_test.sh builds it)" >&2; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# Prints the logs kept in $work and fails: called when something did not come up or a phase failed.
fail() {
    for log in "$work"/*.log; do
        echo "--- $(basename "$log") (last 30 lines) ---" >&2
        tail -30 "$log" >&2
    done
    echo "scaleout_test.sh: $1" >&2
    exit 1
}

# wait_for URL PID NAME: waits for URL to answer 200, or fails if the process died first.
wait_for() {
    wait_healthy "$@" || fail "$3 did not come up"
}

replica_urls=()
replica_pids=()
for i in 1 2 3; do
    port=$(free_port)
    "$serve" --port "$port" >"$work/replica$i.log" 2>&1 &
    pids+=($!)
    replica_pids+=($!)
    replica_urls+=("http://127.0.0.1:$port")
done
for i in 0 1 2; do
    wait_for "${replica_urls[$i]}/health" "${replica_pids[$i]}" "replica $((i + 1))"
done
replica_args=()
for url in "${replica_urls[@]}"; do replica_args+=(--replica "$url"); done

# start_router POLICY URL...: runs vllm-router with static worker URLs and sets $router,
# $router_metrics and $router_pid. Health checks every second and a circuit breaker that opens
# on the first failure take a dead replica out of rotation at once (deploy/kubernetes uses
# gentler values); retries with a short backoff send a request whose replica refused it,
# answered 5xx or dropped the connection before answering to another replica.
start_router() {
    local policy=$1
    shift
    local port metrics_port
    port=$(free_port)
    metrics_port=$(free_port)
    python3 -m vllm_router.launch_router --host 127.0.0.1 --port "$port" --worker-urls "$@" \
        --policy "$policy" \
        --prometheus-host 127.0.0.1 --prometheus-port "$metrics_port" \
        --worker-startup-timeout-secs 60 --worker-startup-check-interval 1 \
        --health-check-interval-secs 1 --health-check-timeout-secs 2 --health-failure-threshold 1 \
        --cb-failure-threshold 1 --cb-timeout-duration-secs 60 \
        --retry-max-retries 5 --retry-initial-backoff-ms 50 --retry-max-backoff-ms 500 \
        --request-timeout-secs 60 --log-level warning \
        >"$work/router-$policy.log" 2>&1 &
    router_pid=$!
    pids+=("$router_pid")
    router="http://127.0.0.1:$port"
    router_metrics="http://127.0.0.1:$metrics_port"
    wait_for "$router/health" "$router_pid" "vllm-router ($policy)"
}

stop_router() {
    kill "$router_pid" 2>/dev/null || true
    wait "$router_pid" 2>/dev/null || true
}

driver() {
    python3 scripts/scaleout_test.py "$@" || fail "the $1 phase failed (see above)"
}

start_router cache_aware "${replica_urls[@]}"
driver routing --router "$router/v1" "${replica_args[@]}" --label cache_aware --out "$work/cache_aware.json"
stop_router

start_router round_robin "${replica_urls[@]}"
driver routing --router "$router/v1" "${replica_args[@]}" --label round_robin --out "$work/round_robin.json"
stop_router

start_router cache_aware "${replica_urls[@]}"
# The driver SIGKILLs replica 2 mid-run; disowned, bash does not report its death as a job.
disown "${replica_pids[1]}"
driver failover --router "$router/v1" "${replica_args[@]}" --label cache_aware --max-tokens 16 \
    --concurrency 6 --kill-pid "${replica_pids[1]}" --kill-url "${replica_urls[1]}" \
    --router-metrics "$router_metrics" --out "$work/kill.json"
stop_router

start_router cache_aware "${replica_urls[0]}" "${replica_urls[2]}"
driver failover --router "$router/v1" --replica "${replica_urls[0]}" --replica "${replica_urls[2]}" \
    --label cache_aware --max-tokens 16 --concurrency 6 --signal TERM --kill-pid "${replica_pids[2]}" \
    --kill-url "${replica_urls[2]}" --router-metrics "$router_metrics" --out "$work/term.json"
stop_router

driver summary "$work/cache_aware.json" "$work/round_robin.json" "$work/kill.json" "$work/term.json"
echo "scaleout_test.sh: ok in $((SECONDS - started)) s"

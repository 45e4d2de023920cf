# Shell helpers for the test scripts (openai_client_test.sh, fuzz_api.sh, scaleout_test.sh,
# validate_manifests.sh): pinned Python tools, free ports, waiting for a server. Source it; it
# defines functions only.

# pip_pinned PACKAGE...: installs each package at its version in scripts/requirements.txt,
# unless that version is installed already.
pip_pinned() {
    local package pin
    for package in "$@"; do
        pin=$(grep "^$package==" "$(dirname "${BASH_SOURCE[0]}")/requirements.txt")
        if [ "$(python3 -m pip show "$package" 2>/dev/null | sed -n 's/^Version: //p')" != "${pin#*==}" ]; then
            python3 -m pip install --quiet "$pin"
        fi
    done
}

# free_port: prints a free loopback TCP port.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_healthy URL PID NAME: polls URL until it answers 200 (60 s at most); returns non-zero,
# with a message, if the process PID exits first or the time runs out.
wait_healthy() {
    for _ in $(seq 1 300); do
        curl -fsS "$1" >/dev/null 2>&1 && return 0
        if ! kill -0 "$2" 2>/dev/null; then
            echo "$3 exited before it was healthy" >&2
            return 1
        fi
        sleep 0.2
    done
    echo "$3 did not get healthy in 60 s" >&2
    return 1
}

# serve_in_background BINARY ARGS...: starts `BINARY --port <free port> ARGS...` logging to a
# temporary file, sets server_url, server_pid and server_log, stops the server and removes its
# log when the script exits, and waits for /health. Returns non-zero, showing the log, if the
# server does not come up.
serve_in_background() {
    local binary=$1
    shift
    local port
    port=$(free_port)
    server_log=$(mktemp)
    "$binary" --port "$port" "$@" >"$server_log" 2>&1 &
    server_pid=$!
    server_url="http://127.0.0.1:$port"
    trap stop_server EXIT
    wait_healthy "$server_url/health" "$server_pid" "$(basename "$binary")" || { show_server_log; return 1; }
}

stop_server() {
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    rm -f "$server_log"
}

# show_server_log: the last lines of the server's log, to stderr, when a check failed.
show_server_log() {
    echo "--- peagle-serve log (last 40 lines) ---" >&2
    tail -40 "$server_log" >&2
}

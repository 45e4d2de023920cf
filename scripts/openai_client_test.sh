#!/usr/bin/env bash
# Builds peagle-serve, starts it with no model arguments (the bundled demo model with its
# trained P-EAGLE drafter) on a free loopback port, runs scripts/openai_client_test.py against it with the official `openai`
# package, and stops the server. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c "import openai" 2>/dev/null; then
    python3 -m pip install --quiet "$(grep '^openai==' scripts/requirements.txt)"
fi
cargo build --locked --bin peagle-serve

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
"${CARGO_TARGET_DIR:-target}/debug/peagle-serve" --port "$port" >"$log" 2>&1 &
pid=$!
cleanup() {
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -f "$log"
}
trap cleanup EXIT

for _ in $(seq 1 300); do
    if curl -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
        break
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
        cat "$log" >&2
        echo "openai_client_test.sh: peagle-serve exited before it was healthy" >&2
        exit 1
    fi
    sleep 0.2
done
curl -fsS "http://127.0.0.1:$port/health" >/dev/null || { cat "$log" >&2; echo "openai_client_test.sh: no /health" >&2; exit 1; }

if ! python3 scripts/openai_client_test.py --base-url "http://127.0.0.1:$port/v1"; then
    echo "--- peagle-serve log ---" >&2
    cat "$log" >&2
    exit 1
fi

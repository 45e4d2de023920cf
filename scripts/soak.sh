#!/usr/bin/env bash
# Soak test, outside CI: starts peagle-serve (the demo model, release build) and runs
# scripts/soak.py against it: N streaming clients for M minutes, 30% hanging up mid-stream,
# reporting RSS and KV blocks over time and what is still held at the end (all should be 0).
#   bash scripts/soak.sh [CLIENTS] [MINUTES] [peagle-serve flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/serve_lib.sh

clients=${1:-16}
minutes=${2:-5}
shift $(($# < 2 ? $# : 2))
cargo build --locked --release --bin peagle-serve
serve_in_background "${CARGO_TARGET_DIR:-target}/release/peagle-serve" "$@" || exit 1
python3 scripts/soak.py --port "${server_url##*:}" --pid "$server_pid" --clients "$clients" --minutes "$minutes" \
    || { show_server_log; exit 1; }

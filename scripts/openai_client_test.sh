#!/usr/bin/env bash
# Builds peagle-serve, starts it with no model arguments (the bundled demo model with its
# trained P-EAGLE drafter) on a free loopback port, runs scripts/openai_client_test.py against
# it with the official `openai` package, and stops the server. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/serve_lib.sh

pip_pinned openai
# peagle-serve as the test suite builds it (scripts/test.sh runs this after `cargo test
# --workspace`, which then has nothing left to compile): `cargo build --bin peagle-serve`
# resolves the dependencies' features without the tests' and compiles most of them again.
cargo test --workspace --locked --no-run 2>&1 | grep -v '^  Executable ' >&2

serve_in_background "${CARGO_TARGET_DIR:-target}/debug/peagle-serve" || exit 1
python3 scripts/openai_client_test.py --base-url "$server_url/v1" || { show_server_log; exit 1; }

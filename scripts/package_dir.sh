#!/usr/bin/env bash
# package_dir.sh NAME: the source directory of the dependency NAME in Cargo.lock's version,
# fetched if it is not yet (for build scripts that read a crate's sources: cudarc's bindings,
# candle's kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fetch --locked >&2
cargo metadata --format-version 1 --locked --all-features |
    python3 -c 'import json, sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == sys.argv[1]).rsplit("/", 1)[0])' "$1"

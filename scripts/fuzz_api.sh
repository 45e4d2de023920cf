#!/usr/bin/env bash
# Fuzzes a real peagle-serve (the demo model) against its own /openapi.json with Schemathesis:
# a bounded, seeded run over every route, checking that nothing answers 5xx, that every status
# and content type is one the spec documents, that responses match their schemas (errors
# included: OpenAI-style JSON), and that requests breaking the schema are refused.
# Needs the built binary (scripts/openai_client_test.sh builds it); installs the pinned
# schemathesis if missing. A short context keeps generated requests quick on a CPU; the API
# key makes the spec's security requirement real, so requests without it must get 401.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/serve_lib.sh

pip_pinned schemathesis
serve_in_background "${CARGO_TARGET_DIR:-target}/debug/peagle-serve" --max-model-len 64 --api-key fuzz || exit 1
checks=not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance
checks+=,negative_data_rejection
# From a scratch directory: Schemathesis keeps a crash cache in the working directory.
scratch=$(mktemp -d)
(cd "$scratch" && python3 -m schemathesis.cli run "$server_url/openapi.json" \
    --header "Authorization: Bearer fuzz" --checks "$checks" \
    --max-examples 25 --seed 1 --generation-database none --request-timeout 60 --no-color) \
    || { rm -rf "$scratch"; show_server_log; exit 1; }
rm -rf "$scratch"

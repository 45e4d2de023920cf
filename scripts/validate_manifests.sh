#!/usr/bin/env bash
# Validates the Kubernetes manifests under deploy/kubernetes offline, as CI runs it: every
# resource against the Kubernetes API's JSON schemas that kubernetes-validate ships (strict, so
# a misspelled or misplaced field fails, not only a wrong type), for the oldest and the newest
# Kubernetes this deployment targets. Installs kubernetes-validate from scripts/requirements.txt
# if it is missing. Exits non-zero if anything fails.
#
# kubernetes-validate knows the built-in kinds only (the HorizontalPodAutoscaler in examples/ is
# one); for any other kind it warns that it has no schema and passes, so this script fails on
# that warning instead: a kind nothing checks must not pass silently. The one non-API file,
# kustomization.yaml, is checked here: known fields, and every manifest beside it listed and
# every listed one present.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/serve_lib.sh

pip_pinned kubernetes-validate

manifests=()
kustomizations=()
while IFS= read -r file; do
    if [ "$(basename "$file")" = kustomization.yaml ]; then
        kustomizations+=("$file")
    else
        manifests+=("$file")
    fi
done < <(find deploy/kubernetes -name '*.yaml' | sort)
[ "${#manifests[@]}" -gt 0 ] || { echo "validate_manifests.sh: no manifests under deploy/kubernetes" >&2; exit 1; }

status=0
for version in 1.30 1.37; do
    out=$(python3 -m kubernetes_validate --strict --quiet -k "$version" "${manifests[@]}" 2>&1) || status=1
    [ -z "$out" ] || echo "$out"
    if grep -q "Couldn't find schema" <<<"$out"; then
        echo "validate_manifests.sh: a kind above has no schema to check it against" >&2
        status=1
    fi
done

python3 - "${kustomizations[@]}" <<'EOF' || status=1
import os
import sys

import yaml

# The Kustomization fields these files may use; anything else is most likely a typo.
KNOWN = {"apiVersion", "kind", "metadata", "namespace", "namePrefix", "nameSuffix", "labels",
         "commonLabels", "commonAnnotations", "resources", "components", "patches", "images",
         "replicas", "configMapGenerator", "secretGenerator", "generatorOptions"}
failed = False
for path in sys.argv[1:]:
    with open(path) as f:
        k = yaml.safe_load(f)
    problems = []
    if k.get("apiVersion") != "kustomize.config.k8s.io/v1beta1" or k.get("kind") != "Kustomization":
        problems.append("not a kustomize.config.k8s.io/v1beta1 Kustomization")
    problems += [f"unknown field {key!r}" for key in sorted(set(k) - KNOWN)]
    here = os.path.dirname(path)
    listed = k.get("resources", [])
    problems += [f"lists {r!r}, which does not exist" for r in listed
                 if not os.path.exists(os.path.join(here, r))]
    beside = {f for f in os.listdir(here) if f.endswith(".yaml") and f != "kustomization.yaml"}
    problems += [f"does not list {f!r}" for f in sorted(beside - set(listed))]
    for problem in problems:
        print(f"ERROR {path}: {problem}")
    if not problems:
        print(f"{path}: ok ({len(listed)} resources)")
    failed |= bool(problems)
sys.exit(1 if failed else 0)
EOF

# Where kubectl is installed (CI need not have it), also build the kustomization the way
# `kubectl apply -k` will, and validate what comes out.
if command -v kubectl >/dev/null 2>&1; then
    for k in "${kustomizations[@]}"; do
        built=$(mktemp)
        if kubectl kustomize "$(dirname "$k")" >"$built"; then
            python3 -m kubernetes_validate --strict --quiet "$built" || status=1
            echo "$k: kubectl kustomize builds $(grep -c '^kind:' "$built") resources"
        else
            status=1
        fi
        rm -f "$built"
    done
fi

if [ "$status" -ne 0 ]; then
    echo "validate_manifests.sh: FAILED" >&2
    exit 1
fi
echo "validate_manifests.sh: ${#manifests[@]} files valid against Kubernetes 1.30 and 1.37 (strict)"

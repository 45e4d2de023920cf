#!/usr/bin/env bash
# One command for a GPU host: the GPU tests, then the GPU bench, into
# benches/results/gpu-<date>/ (report.md, report.json, logs, the sweeps' JSON and PNG).
#
# Needs the packed binaries of scripts/build_cuda.sh, target/gpu/{tests,bench}.tar.xz (built
# elsewhere: the GPU host has no Rust toolchain), an NVIDIA driver, and Python with PyTorch,
# transformers and safetensors, whose CUDA wheels also provide cuBLAS, cuRAND, NVRTC and the
# CUDA runtime. Every step runs even when one before it failed; the exit status says whether
# all passed.
#   scripts/gpu_check.sh [PART]   one part (default: all of them, tests first):
#     tests     the GPU tests
#     demo      the matmul against cuBLAS; the demo model's sweeps, without and with CUDA
#               graphs; transformers as the peer
#     llama     a random Llama-8B-shaped target's decode step against the HBM bound (16 GB to write)
#     gpt-oss   a random gpt-oss-20b-shaped MXFP4 target's sweeps (19 GB to write)
#     bench     demo, llama and gpt-oss; QUICK=1 leaves out llama and gpt-oss
# Each part takes a few minutes and adds to the day's results directory, and the report is
# remade from whatever is there, so the parts can run as separate commands.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
part=${1:-all}
case $part in
tests | demo | llama | gpt-oss | bench | all) ;;
*)
    echo "gpu_check.sh: unknown part '$part' (tests, demo, llama, gpt-oss, bench or all)" >&2
    exit 2
    ;;
esac

bin=$PWD/target/carry
mkdir -p "$bin"
for pack in target/gpu/*.tar.xz; do
    [ -e "$pack" ] && python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$pack" "$bin"
done
out=benches/results/gpu-$(date -u +%Y-%m-%d)
mkdir -p "$out"
status=0
step() { echo "== $*" | tee -a "$out/steps.log"; }
fail() { echo "FAILED: $*" | tee -a "$out/steps.log"; status=1; }

# The CUDA libraries of the host's PyTorch wheels, for the binaries' cuBLAS, cuRAND and NVRTC.
libs=$(python3 -c 'import glob, site; print(":".join(sorted({d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")})))')
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The test binaries find the repository's models at the path they were built in.
built_in=$(cat "$bin/BUILD_ROOT")
if [ "$built_in" != "$PWD" ] && [ ! -e "$built_in" ]; then
    mkdir -p "$(dirname "$built_in")" && ln -s "$PWD" "$built_in"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv >"$out/gpu.csv" ||
    fail "nvidia-smi"

# Each GPU test in a process of its own, under a time limit: a CUDA error such as an illegal
# address ends its process's context, and would fail every test after it in a shared one. A
# failed test runs again under compute-sanitizer's memcheck, where the host has it, to name the
# kernel and the access.
run_tests() {
step "GPU tests"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
for test in "$bin"/gpu-*; do
    name=$(basename "$test")
    : >"$out/$name.log"
    passed=0 failed=()
    while read -r case; do
        echo "---- $case" >>"$out/$name.log"
        if timeout "${TEST_TIMEOUT:-240}" "$test" --exact "$case" --test-threads=1 --nocapture >>"$out/$name.log" 2>&1; then
            passed=$((passed + 1))
        else
            failed+=("$case")
        fi
    done < <("$test" --list 2>>"$out/$name.log" | sed -n 's/: test$//p')
    echo "$name: $passed passed, ${#failed[@]} failed" | tee -a "$out/steps.log"
    [ $((passed + ${#failed[@]})) -gt 0 ] || fail "$name lists no tests (see $name.log)"
    for case in "${failed[@]}"; do
        fail "$name $case (see $name.log)"
        if [ -n "$sanitizer" ]; then
            timeout "${TEST_TIMEOUT:-240}" "$sanitizer" --tool memcheck "$test" --exact "$case" --test-threads=1 \
                >"$out/$name-$case.memcheck.log" 2>&1
            grep -E "^========= (Invalid|Program hit|ERROR SUMMARY)" "$out/$name-$case.memcheck.log" | head -5
        fi
    done
done
}

run_demo() {
step "the batch-invariant matmul against cuBLAS, bf16, 4096 -> 14336"
"$bin/peagle-gemm-vs-cublas" >"$out/gemm-vs-cublas.jsonl" 2>"$out/gemm-vs-cublas.log" || fail "gemm vs cuBLAS (see gemm-vs-cublas.log)"

step "demo model: plain, EAGLE-3 K=3 and P-EAGLE K=7 at concurrency 1, 4 and 16"
"$bin/peagle-bench" sweep --serve-bin "$bin/peagle-serve" --device cuda \
    --model models/pystdlib-12l --draft-model models/pystdlib-12l-peagle --peagle-k 7 \
    --eagle3-draft-model models/pystdlib-12l-eagle3 --eagle3-k 3 --server-arg=--fixed-k \
    --dataset models/pystdlib-12l/eval_prompts.jsonl --num-prompts 48 --concurrency 1,4,16 \
    --max-tokens 128 --out "$out/demo-sweep" >"$out/demo-sweep.log" 2>&1 || fail "demo sweep (see demo-sweep.log)"

step "demo model by CUDA graphs: the same sweep with --cuda-graphs"
"$bin/peagle-bench" sweep --serve-bin "$bin/peagle-serve" --device cuda \
    --model models/pystdlib-12l --draft-model models/pystdlib-12l-peagle --peagle-k 7 \
    --eagle3-draft-model models/pystdlib-12l-eagle3 --eagle3-k 3 --server-arg=--fixed-k --server-arg=--cuda-graphs \
    --dataset models/pystdlib-12l/eval_prompts.jsonl --num-prompts 48 --concurrency 1,4,16 \
    --max-tokens 128 --out "$out/demo-sweep-graphs" >"$out/demo-sweep-graphs.log" 2>&1 ||
    fail "demo sweep by CUDA graphs (see demo-sweep-graphs.log)"

step "transformers generate on the demo model (the peer)"
python3 scripts/gpu_transformers_peer.py --model models/pystdlib-12l \
    --dataset models/pystdlib-12l/eval_prompts.jsonl --num-prompts 16 --max-tokens 128 \
    --out "$out/transformers.json" >"$out/transformers.log" 2>&1 || fail "transformers peer (see transformers.log)"
"$bin/peagle-generate" --device cuda --model models/pystdlib-12l \
    --prompts-file <(head -16 models/pystdlib-12l/eval_prompts.jsonl) --max-tokens 128 --ignore-eos \
    --stats-json "$out/peagle-generate-demo.json" >/dev/null 2>"$out/peagle-generate-demo.log" ||
    fail "peagle-generate on the demo (see peagle-generate-demo.log)"
}

run_llama() {
    step "Llama-8B-shaped random bf16 target: one decode step against the HBM bound, without and with CUDA graphs"
    model=${TMPDIR:-/tmp}/peagle-llama-8b
    python3 scripts/make_random_llama.py --out "$model" >"$out/llama-8b-make.log" 2>&1 &&
        cp "$model/bound.json" "$out/llama-8b-bound.json" || fail "making the 8B checkpoint (see llama-8b-make.log)"
    for graphs in "" --cuda-graphs; do
        name=llama-8b-decode${graphs:+-graphs}
        "$bin/peagle-generate" --device cuda --model "$model" --prompt "t5 t6 t7 t8" --max-tokens 64 --ignore-eos \
            $graphs --stats-json "$out/$name.json" >/dev/null 2>"$out/$name.log" || fail "8B decode (see $name.log)"
    done
    rm -rf "$model"
}

run_gpt_oss() {
    step "gpt-oss-20b-shaped random MXFP4 target: plain, EAGLE-3 K=3 and P-EAGLE K=7 at concurrency 1, 16 and 64"
    model=${TMPDIR:-/tmp}/peagle-gpt-oss-20b
    drafters=$model-drafters
    {
        python3 scripts/make_random_gpt_oss.py --gpu --out "$model" &&
            python3 scripts/make_random_drafters.py --gpu --target "$model" --out "$drafters"
    } >"$out/gpt-oss-make.log" 2>&1 && cp "$model/bound.json" "$out/gpt-oss-bound.json" ||
        fail "making the gpt-oss checkpoint and drafters (see gpt-oss-make.log)"
    # Random drafters accept nothing: every step drafts K (--fixed-k), so the step times are the modes' own.
    gpt_oss_sweep() { # NAME PROMPTS CONCURRENCY [SERVER ARGUMENT...]
        local name=$1 prompts=$2 concurrency=$3
        shift 3
        "$bin/peagle-bench" sweep --serve-bin "$bin/peagle-serve" --device cuda --model "$model" \
            --draft-model "$drafters/peagle" --peagle-k 7 --eagle3-draft-model "$drafters/eagle3" --eagle3-k 3 \
            --server-arg=--fixed-k --server-arg=--max-model-len=1024 "$@" --dataset "$model/prompts.jsonl" \
            --num-prompts "$prompts" --concurrency "$concurrency" --max-tokens 128 --out "$out/$name" \
            >"$out/$name.log" 2>&1 || fail "$name (see $name.log)"
    }
    # Concurrency 1 on 8 of the prompts, after a level with all 8 at once that warms each server
    # (the report leaves it out), without CUDA graphs and with them; 16 and 64 on all 64.
    gpt_oss_sweep gpt-oss-sweep-c1 8 8,1
    gpt_oss_sweep gpt-oss-sweep-c1-graphs 8 8,1 --server-arg=--cuda-graphs
    gpt_oss_sweep gpt-oss-sweep 64 16,64
    rm -rf "$model" "$drafters"
}

case $part in
tests) run_tests ;;
demo) run_demo ;;
llama) run_llama ;;
gpt-oss) run_gpt_oss ;;
bench)
    run_demo
    [ -n "${QUICK:-}" ] || { run_llama; run_gpt_oss; }
    ;;
all)
    run_tests
    run_demo
    [ -n "${QUICK:-}" ] || { run_llama; run_gpt_oss; }
    ;;
esac

step "report"
python3 scripts/gpu_report.py "$out" || fail "report"
echo "results in $out; status $status"
exit $status

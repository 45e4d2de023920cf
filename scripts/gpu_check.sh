#!/usr/bin/env bash
# One command for a GPU host: the GPU tests, then the GPU bench, into
# benches/results/gpu-<date>/ (report.md, report.json, logs, the sweeps' JSON and PNG).
#
# Needs the packed binaries of scripts/build_cuda.sh, target/gpu/binaries.tar.xz, or the
# part's own of tests.tar.xz and bench.tar.xz (built elsewhere: the GPU host has no Rust toolchain), an NVIDIA driver, and Python with PyTorch,
# transformers and safetensors, whose CUDA wheels also provide cuBLAS, cuRAND, NVRTC and the
# CUDA runtime. Every step runs even when one before it failed; the exit status says whether
# all ran and passed.
#   scripts/gpu_check.sh [PART...]   the parts named, in that order (default: all of them):
#     tests     the GPU tests
#     kernels   the kernels alone, in seconds and with no model: the matmul's forms against
#               cuBLAS, and what bounds its one-row kernel (where the host has Nsight Compute's
#               ncu); gpt-oss-shaped MXFP4 experts and Qwen3-30B-A3B-shaped dense ones in
#               both tile forms; paged attention at gpt-oss's and Llama-8B's heads
#     demo      the demo model's sweeps, without and with CUDA graphs; transformers as the peer
#     gpt-oss   a random gpt-oss-20b-shaped MXFP4 target's GPU time by kernel (where the host
#               has ncu) and sweeps (13 GB to write)
#     llama     a random Llama-8B-shaped target's decode step against the HBM bound, and its GPU
#               time by kernel (16 GB to write)
#     bench     kernels, demo, gpt-oss and llama; QUICK=1 leaves out gpt-oss and llama
#     all       tests, then bench
# Each part adds to the day's results directory, and the report is remade from whatever is
# there, so the parts can run as separate commands.
#
# A GPU lease is short, so a run can be held to a time and keep its results when it is cut off:
#   GPU_CHECK_SECONDS=N   no step starts after N seconds, each runs under a limit of the time
#                         left, and the steps not started are logged as skipped (exit status 3)
#   GPU_CHECK_OUT=DIR     the results directory (default benches/results/gpu-<date>), for a
#                         second run on a day that already has one
#   GPU_CHECK_TAR=FILE    the results directory packed into FILE (.tgz) after every step, so
#                         that a command stopped at its limit still leaves what it measured
#   TEST_TIMEOUT=N        the most seconds one GPU test may take (default 120)
#   PROFILE_TIMEOUT=N     the most seconds one kernel profile may take (default 150)
#   GRAPH_MEMCHECK=1      the tests part also runs the CUDA-graph tests under memcheck
#   GPT_OSS_STEPS="..."   which of the gpt-oss part's steps run, in their order (default:
#                         "profiles c1 graphs batched policy"; "policy" is concurrency 64 with k
#                         left to the speculation policy; "profiles" is the three kernel profiles
#                         and the experts' kernel details, each of which may also be named alone
#                         (gpt-oss-decode, gpt-oss-peagle, gpt-oss-prefill, gpt-oss-moe-details);
#                         "fma" adds the c1 and batched sweeps on the CUDA-core matmul), so that
#                         a lease can split the part
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(all)
for part in "${parts[@]}"; do
    case $part in
    tests | kernels | demo | llama | gpt-oss | bench | all) ;;
    *)
        echo "gpu_check.sh: unknown part '$part' (tests, kernels, demo, gpt-oss, llama, bench or all)" >&2
        exit 2
        ;;
    esac
done
started=$(date +%s)
deadline=$((started + ${GPU_CHECK_SECONDS:-31536000}))

bin=$PWD/target/carry
mkdir -p "$bin"
for pack in target/gpu/*.tar.xz; do
    [ -e "$pack" ] && python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$pack" "$bin"
done
out=${GPU_CHECK_OUT:-benches/results/gpu-$(date -u +%Y-%m-%d)}
mkdir -p "$out"
status=0 skipped=0
left() { echo $((deadline - $(date +%s))); }
# The results so far, packed where GPU_CHECK_TAR says (written whole, then renamed).
save() {
    [ -n "${GPU_CHECK_TAR:-}" ] || return 0
    tar czf "$GPU_CHECK_TAR.part" -C "$(dirname "$out")" "$(basename "$out")" && mv "$GPU_CHECK_TAR.part" "$GPU_CHECK_TAR"
}
# step TITLE: logs a step and says whether it may start: not with under a minute left.
step() {
    save
    if [ "$(left)" -lt 60 ]; then
        echo "SKIPPED (out of time): $*" | tee -a "$out/steps.log"
        skipped=1
        return 1
    fi
    echo "== $* ($(($(date +%s) - started)) s in)" | tee -a "$out/steps.log"
}
fail() { echo "FAILED: $*" | tee -a "$out/steps.log"; status=1; }
# timed COMMAND...: COMMAND under a limit of the time left (its process group killed past it).
timed() { timeout --kill-after=10 "$(max 1 "$(left)")" "$@"; }
min() { echo $(($1 < $2 ? $1 : $2)); }
max() { echo $(($1 > $2 ? $1 : $2)); }

# The CUDA libraries of the host's PyTorch wheels, for the binaries' cuBLAS, cuRAND and NVRTC.
libs=$(python3 -c 'import glob, site; print(":".join(sorted({d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")})))')
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The driver JIT-compiles the binaries' PTX when a process first loads it, and keeps the result
# in its cache for the next process: room for all of it, so that only the first test pays.
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
# The test binaries find the repository's models at the path they were built in. Without the
# pack, or that path, every step would fail on its own: stop now, saying why.
if [ ! -f "$bin/BUILD_ROOT" ]; then
    echo "FAILED: no packed binaries (carry a pack of target/gpu/ from scripts/build_cuda.sh)" |
        tee -a "$out/steps.log"
    save
    exit 2
fi
built_in=$(cat "$bin/BUILD_ROOT")
if [ "$built_in" != "$PWD" ] && [ ! -e "$built_in" ]; then
    if ! { mkdir -p "$(dirname "$built_in")" && ln -s "$PWD" "$built_in"; }; then
        echo "FAILED: cannot link $built_in, where the test binaries read the models" | tee -a "$out/steps.log"
        save
        exit 2
    fi
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv >"$out/gpu.csv" ||
    fail "nvidia-smi"

# A GPU test that failed by a fault (a CUDA error or a crash) runs again under compute-sanitizer's
# memcheck, where the host has it, to name the kernel and the access; one that failed an
# assertion or ran out of time does not, as memcheck would only slow it down. The reruns wait
# for the end of every part, and take only the time left then (a minute each at most), so a
# kernel that faults many tests costs no part its time.
source scripts/gpu_test_lib.sh
export GPU_TESTS_DEADLINE=$deadline
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
# run_test_binary TEST NAME [VAR=VALUE...]: every test of the binary TEST, each in a process of
# its own (scripts/gpu_test_lib.sh), logged under NAME/ and counted in steps.log.
run_test_binary() {
    local test=$1 name=$2 case
    shift 2
    run_gpu_tests "$test" "$name" "$out" "$@"
    echo "$name: $gpu_tests_passed passed, ${#gpu_tests_failed[@]} failed" | tee -a "$out/steps.log"
    if [ $gpu_tests_unrun -gt 0 ]; then
        echo "SKIPPED (out of time): $gpu_tests_unrun of $name's tests" | tee -a "$out/steps.log"
        skipped=1
    fi
    for case in "${gpu_tests_failed[@]}"; do
        fail "$name $case (see $name/)"
    done
    for case in "${gpu_tests_faulted[@]}"; do
        faulted+=("$name $test $case $*")
    done
    save
}
faulted=()

# The faulted tests under memcheck, in the time left.
memcheck_faulted() {
    local entry name test case vars
    [ -n "$sanitizer" ] && [ ${#faulted[@]} -gt 0 ] || return 0
    step "memcheck of the ${#faulted[@]} faulted GPU tests" || return
    for entry in "${faulted[@]}"; do
        read -r name test case vars <<<"$entry"
        [ "$(left)" -ge 60 ] || break
        # shellcheck disable=SC2086 # the VAR=VALUE words, none with spaces
        env $vars timeout --kill-after=10 "$(min 60 "$(left)")" "$sanitizer" --tool memcheck "$test" \
            --exact "$case" --test-threads=1 >"$out/$name/$case.memcheck.log" 2>&1
        echo "memcheck of $name $case: $(grep -hE "^========= (Invalid|Program hit)" \
            "$out/$name/$case.memcheck.log" | head -1)" | tee -a "$out/steps.log"
    done
}

run_tests() {
    step "GPU tests" || return
    local test
    for test in "$bin"/gpu-*; do
        run_test_binary "$test" "$(basename "$test")"
    done
    # The models and the engine again on the CUDA-core matmul, which a process chooses once.
    for test in gpu-peagle-models gpu-peagle-engine; do
        run_test_binary "$bin/$test" "$test-fma" PEAGLE_CUDA_MATMUL=fma
    done
    # Whether memcheck misreads a graph that reuses a freed allocation's address, as peagle's
    # CUDA graphs draw reports that their bit-exact outputs belie (scripts/graph_memcheck_probe.cu).
    timed "$bin/peagle-graph-memcheck-probe" >"$out/graph-memcheck-probe.log" 2>&1 ||
        fail "the graph memcheck probe (see graph-memcheck-probe.log)"
    if [ -n "$sanitizer" ]; then
        timeout --kill-after=10 "$(min 60 "$(max 1 "$(left)")")" "$sanitizer" --tool memcheck \
            "$bin/peagle-graph-memcheck-probe" >>"$out/graph-memcheck-probe.log" 2>&1
        echo "graph memcheck probe: $(grep -h 'graph memcheck probe' "$out/graph-memcheck-probe.log" | tail -1 |
            sed 's/^graph memcheck probe: //'); memcheck: $(grep -h 'ERROR SUMMARY' "$out/graph-memcheck-probe.log" |
            tail -1 | sed 's/^========= //')" | tee -a "$out/steps.log"
        # With GRAPH_MEMCHECK=1, the engine's own graphs under memcheck, target and drafter: the
        # reports of an earlier session came from steps like these, and graphs stay opt-in until
        # they are explained. Minutes each, so not by default.
        local case
        [ -n "${GRAPH_MEMCHECK:-}" ] || return 0
        for case in steps_by_cuda_graphs_equal_steps_without drafter_passes_by_cuda_graphs_equal_passes_without; do
            [ "$(left)" -ge 120 ] || break
            timeout --kill-after=10 "$(min 240 "$(left)")" "$sanitizer" --tool memcheck "$bin/gpu-peagle-models" \
                --exact "graphs::$case" --test-threads=1 >"$out/memcheck-$case.log" 2>&1
            # A test whose graph launch memcheck stopped may then hang until cut off: its first
            # report still says which kernel and access.
            local log=$out/memcheck-$case.log summary first result
            summary=$(grep -h 'ERROR SUMMARY' "$log" | tail -1 | sed 's/^========= //')
            first=$(grep -hm1 -E '^========= (Invalid|Program hit)' "$log" | sed 's/^========= //')
            result=$(grep -h '^test result' "$log" | tail -1)
            echo "memcheck of $case: ${summary:-no summary (cut off)}; first report: ${first:-none}; test: ${result:-no result}" |
                tee -a "$out/steps.log"
        done
    fi
}

# Nsight Compute's command line, where the host has it.
ncu_path() { command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 | grep .; }
# The seconds one ncu run may take: ncu writes what it measured when its program ends, so a
# run cut off by the time left would keep nothing; each has a limit of its own (PROFILE_TIMEOUT).
ncu_limit() { min "${PROFILE_TIMEOUT:-150}" "$(max 1 "$(left)")"; }

# kernel_details NAME KERNEL SKIP COMMAND...: what bounds one launch of the kernels that KERNEL
# (an ncu --kernel-name filter) names in COMMAND, the one after the first SKIP of them:
# Nsight Compute's speed of light, memory, occupancy, launch, scheduler and
# warp-stall sections, as text in NAME.txt.
kernel_details() {
    local name=$1 kernel=$2 skip=$3 ncu
    shift 3
    ncu=$(ncu_path) || {
        echo "no ncu on this host: $name left out" | tee -a "$out/steps.log"
        return
    }
    step "$name: what bounds one launch of $kernel (ncu)" || return
    timeout --kill-after=10 "$(ncu_limit)" \
        "$ncu" --kernel-name "$kernel" --launch-skip "$skip" --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section SchedulerStats --section WarpStateStats --print-units base --log-file "$out/$name.txt" \
        "$@" >/dev/null 2>"$out/$name.log" || fail "$name (see $name.log)"
}

# kernel_profile NAME MODEL PROMPT TOKENS [ARGUMENT...]: the GPU time of every kernel over the
# engine steps that generate TOKENS tokens of a prompt (its prefill first), recorded by Nsight
# Compute in NAME-kernels.csv, with NAME-kernels.json saying how many steps (a speculative step
# gives several tokens). The same prompt runs once before, outside the profiled range, to warm
# the engine up, and takes as many steps (greedy). ARGUMENTs go to peagle-generate.
# ncu times each kernel alone, with the caches flushed before it, at the clocks it would run.
kernel_profile() {
    local name=$1 model=$2 prompt=$3 tokens=$4 ncu prompts
    shift 4
    ncu=$(ncu_path) || {
        echo "no ncu on this host: $name's kernel profile left out" | tee -a "$out/steps.log"
        return
    }
    step "$name: GPU time by kernel over the steps of $tokens token(s) (ncu)" || return
    prompts=$(mktemp)
    python3 -c 'import json, sys; print((json.dumps({"prompt": sys.argv[1]}) + "\n") * 2, end="")' "$prompt" >"$prompts"
    # At most 5000 launches, so that a profile ends within its limit (ncu_limit).
    timeout --kill-after=10 "$(ncu_limit)" \
        "$ncu" --profile-from-start off --launch-count 5000 --metrics gpu__time_duration.sum --csv \
        --print-units base --clock-control none --log-file "$out/$name-kernels.csv" \
        "$bin/peagle-generate" --device cuda --model "$model" --prompts-file "$prompts" \
        --max-tokens "$tokens" --ignore-eos --cuda-profile --stats-json "$prompts.stats" "$@" \
        >/dev/null 2>"$out/$name-kernels.log" &&
        python3 -c 'import json, sys; print(json.dumps({"steps": json.load(open(sys.argv[1]))["step_times"]["steps"] // 2}))' \
            "$prompts.stats" >"$out/$name-kernels.json" ||
        fail "$name's kernel profile (see $name-kernels.log)"
    rm -f "$prompts" "$prompts.stats"
}

run_kernels() {
    if step "the batch-invariant matmul's forms against cuBLAS, bf16, 4096 -> 14336"; then
        timed "$bin/peagle-gemm-vs-cublas" >"$out/gemm-vs-cublas.jsonl" 2>"$out/gemm-vs-cublas.log" ||
            fail "gemm vs cuBLAS (see gemm-vs-cublas.log)"
    fi
    # Why the CUDA cores' matmul reads its weights at M = 1 at well under the copy bandwidth
    # (cuBLAS reads them twice as fast): its first timed launch.
    kernel_details linear-row-details 'regex:^linear_bf16_bf16_row$' 1 "$bin/peagle-gemm-vs-cublas"
    if step "gpt-oss-shaped MXFP4 experts, 1 to 2048 rows: narrow and wide tiles on the tensor cores, and the CUDA cores; then Qwen3-30B-A3B-shaped dense experts"; then
        timed "$bin/peagle-moe-experts" >"$out/moe-experts.jsonl" 2>"$out/moe-experts.log" ||
            fail "mixture-of-experts blocks (see moe-experts.log)"
    fi
    if step "paged attention at gpt-oss's and Llama-8B's heads: decode rows, verification windows and prefill chunks, 128 to 32768 positions"; then
        timed "$bin/peagle-paged-attention" >"$out/paged-attention.jsonl" 2>"$out/paged-attention.log" ||
            fail "paged attention (see paged-attention.log)"
    fi
    # Whether a long context's decode row waits on memory latency or bandwidth: its first timed
    # launch, at gpt-oss's heads and 8192 positions.
    kernel_details attention-details 'regex:^paged_attention_(heads_)?bf16_bf16$' 1 "$bin/peagle-paged-attention" \
        gpt-oss-20b 1 1 8192
    # And a short decode row's, at 128 positions: how much of its time is the latency of the
    # kernel's chain of dependent loads and of its warps' merge.
    kernel_details attention-details-short 'regex:^paged_attention_(heads_)?bf16_bf16$' 1 \
        "$bin/peagle-paged-attention" gpt-oss-20b 1 1 128
}

run_demo() {
    local graphs name
    for graphs in "" --cuda-graphs; do
        name=demo-sweep${graphs:+-graphs}
        step "demo model${graphs:+ by CUDA graphs}: plain, EAGLE-3 K=3 and P-EAGLE K=7 at concurrency 1, 4 and 16" ||
            continue
        timed "$bin/peagle-bench" sweep --serve-bin "$bin/peagle-serve" --device cuda \
            --model models/pystdlib-12l --draft-model models/pystdlib-12l-peagle --peagle-k 7 \
            --eagle3-draft-model models/pystdlib-12l-eagle3 --eagle3-k 3 --server-arg=--fixed-k \
            ${graphs:+--server-arg=$graphs} --dataset models/pystdlib-12l/eval_prompts.jsonl --num-prompts 48 \
            --concurrency 1,4,16 --max-tokens 128 --out "$out/$name" >"$out/$name.log" 2>&1 ||
            fail "$name (see $name.log)"
    done

    # Where a step of the demo by CUDA graphs goes, plain and P-EAGLE K=7: its kernels' GPU time
    # against the sweep's engine time a step says how much of the step waits on the host.
    local prompt
    prompt=$(python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["prompt"])' \
        models/pystdlib-12l/eval_prompts.jsonl)
    kernel_profile demo-decode-graphs models/pystdlib-12l "$prompt" 32 --cuda-graphs
    kernel_profile demo-peagle-graphs models/pystdlib-12l "$prompt" 32 --cuda-graphs \
        --draft-model models/pystdlib-12l-peagle --parallel-drafting --k 7

    if step "transformers generate on the demo model (the peer)"; then
        timed python3 scripts/gpu_transformers_peer.py --model models/pystdlib-12l \
            --dataset models/pystdlib-12l/eval_prompts.jsonl --num-prompts 16 --max-tokens 128 \
            --out "$out/transformers.json" >"$out/transformers.log" 2>&1 || fail "transformers peer (see transformers.log)"
        timed "$bin/peagle-generate" --device cuda --model models/pystdlib-12l \
            --prompts-file <(head -16 models/pystdlib-12l/eval_prompts.jsonl) --max-tokens 128 --ignore-eos \
            --stats-json "$out/peagle-generate-demo.json" >/dev/null 2>"$out/peagle-generate-demo.log" ||
            fail "peagle-generate on the demo (see peagle-generate-demo.log)"
    fi
}

run_gpt_oss() {
    wanted() { [[ " ${GPT_OSS_STEPS:-profiles c1 graphs batched policy} " == *" $1 "* ]]; }
    step "gpt-oss-20b-shaped random MXFP4 target and random drafters: made on the GPU" || return
    local model=${TMPDIR:-/tmp}/peagle-gpt-oss-20b
    local drafters=$model-drafters
    {
        timed python3 scripts/make_random_gpt_oss.py --gpu --out "$model" &&
            timed python3 scripts/make_random_drafters.py --gpu --target "$model" --out "$drafters"
    } >"$out/gpt-oss-make.log" 2>&1 && cp "$model/bound.json" "$out/gpt-oss-bound.json" || {
        fail "making the gpt-oss checkpoint and drafters (see gpt-oss-make.log)"
        return
    }
    # Random drafters accept nothing: every step drafts K (--fixed-k), so the step times are the
    # modes' own; the policy sweep leaves k to the speculation policy, as a server does by
    # default, which must find that drafting does not pay and keep plain decoding's pace.
    gpt_oss_sweep() { # NAME PROMPTS CONCURRENCY [SERVER ARGUMENT...]
        local name=$1 prompts=$2 concurrency=$3 fixed=(--server-arg=--fixed-k)
        shift 3
        [[ $name == *policy* ]] && fixed=()
        step "gpt-oss: plain, EAGLE-3 K=3 and P-EAGLE K=7 at concurrency $concurrency ($name)" || return
        timed "$bin/peagle-bench" sweep --serve-bin "$bin/peagle-serve" --device cuda --model "$model" \
            --draft-model "$drafters/peagle" --peagle-k 7 --eagle3-draft-model "$drafters/eagle3" --eagle3-k 3 \
            "${fixed[@]}" --server-arg=--max-model-len=1024 "$@" --dataset "$model/prompts.jsonl" \
            --num-prompts "$prompts" --concurrency "$concurrency" --max-tokens 128 --out "$out/$name" \
            >"$out/$name.log" 2>&1 || fail "$name (see $name.log)"
    }
    # profile RUN NAME ...: RUN NAME ... (kernel_profile or kernel_details) where the profiles
    # or NAME itself are wanted.
    profile() { if wanted profiles || wanted "$2"; then "$@"; fi; }
    # The kernel profiles first: where a step's time goes is what the next change needs.
    # Decode: a prompt of 4 words, so that its prefill weighs as little as a decode step.
    # Prefill: one step of 512 words.
    local words short long
    words=$(python3 -c 'import json, sys; print(" ".join(w for l in open(sys.argv[1]) for w in json.loads(l)["prompt"].split()))' \
        "$model/prompts.jsonl")
    short=$(echo "$words" | cut -d' ' -f1-4) long=$(echo "$words" | cut -d' ' -f1-512)
    profile kernel_profile gpt-oss-decode "$model" "$short" 4 --max-model-len 1024
    profile kernel_profile gpt-oss-peagle "$model" "$short" 4 --max-model-len 1024 --draft-model "$drafters/peagle" \
        --parallel-drafting --k 7
    profile kernel_profile gpt-oss-prefill "$model" "$long" 1 --max-model-len 1024
    # What bounds the experts' first projection in a decode step: the 24 launches of the
    # prefill skipped, and six of the first decode step's.
    profile kernel_details gpt-oss-moe-details 'regex:^moe_gate_up' 30 "$bin/peagle-generate" --device cuda \
        --model "$model" --prompt "$short" --max-tokens 3 --ignore-eos --max-model-len 1024
    # Concurrency 1 on 8 of the prompts, after a level with all 8 at once that warms each server
    # (the report leaves it out), without CUDA graphs and with them; 16 and 64 on all 64.
    if wanted c1; then gpt_oss_sweep gpt-oss-sweep-c1 8 8,1; fi
    if wanted graphs; then gpt_oss_sweep gpt-oss-sweep-c1-graphs 8 8,1 --server-arg=--cuda-graphs; fi
    if wanted batched; then gpt_oss_sweep gpt-oss-sweep 64 16,64; fi
    if wanted policy; then gpt_oss_sweep gpt-oss-sweep-policy 64 64; fi
    # The same sweeps on the CUDA-core matmul, which the servers read from the environment.
    if wanted fma; then
        PEAGLE_CUDA_MATMUL=fma gpt_oss_sweep gpt-oss-sweep-c1-fma 8 8,1
        PEAGLE_CUDA_MATMUL=fma gpt_oss_sweep gpt-oss-sweep-fma 64 16,64
    fi
    rm -rf "$model" "$drafters"
}

run_llama() {
    step "Llama-8B-shaped random bf16 target: one decode step against the HBM bound, without and with CUDA graphs" ||
        return
    local model=${TMPDIR:-/tmp}/peagle-llama-8b graphs name
    timed python3 scripts/make_random_llama.py --out "$model" >"$out/llama-8b-make.log" 2>&1 &&
        cp "$model/bound.json" "$out/llama-8b-bound.json" || {
        fail "making the 8B checkpoint (see llama-8b-make.log)"
        return
    }
    for graphs in "" --cuda-graphs; do
        name=llama-8b-decode${graphs:+-graphs}
        step "Llama-8B-shaped decode${graphs:+ by CUDA graphs}" || continue
        timed "$bin/peagle-generate" --device cuda --model "$model" --prompt "t5 t6 t7 t8" --max-tokens 64 --ignore-eos \
            $graphs --stats-json "$out/$name.json" >/dev/null 2>"$out/$name.log" || fail "8B decode (see $name.log)"
    done
    if step "Llama-8B-shaped decode by the CUDA-core matmul (PEAGLE_CUDA_MATMUL=fma)"; then
        PEAGLE_CUDA_MATMUL=fma timed "$bin/peagle-generate" --device cuda --model "$model" --prompt "t5 t6 t7 t8" \
            --max-tokens 64 --ignore-eos --stats-json "$out/llama-8b-decode-fma.json" >/dev/null \
            2>"$out/llama-8b-decode-fma.log" || fail "8B decode by the CUDA cores (see llama-8b-decode-fma.log)"
    fi
    kernel_profile llama-8b-decode "$model" "t5 t6 t7 t8" 4
    rm -rf "$model"
}

run_bench() {
    run_kernels
    run_demo
    [ -n "${QUICK:-}" ] || { run_gpt_oss; run_llama; }
}

for part in "${parts[@]}"; do
    case $part in
    tests) run_tests ;;
    kernels) run_kernels ;;
    demo) run_demo ;;
    gpt-oss) run_gpt_oss ;;
    llama) run_llama ;;
    bench) run_bench ;;
    all)
        run_tests
        run_bench
        ;;
    esac
done

memcheck_faulted
# The report is made whatever the time left: it takes a second.
echo "== report" | tee -a "$out/steps.log"
python3 scripts/gpu_report.py "$out" || fail "report"
save
echo "results in $out; $(($(date +%s) - started)) s; status $status${GPU_CHECK_TAR:+, packed in $GPU_CHECK_TAR}"
[ $status -eq 0 ] || exit 1
[ $skipped -eq 0 ] || exit 3

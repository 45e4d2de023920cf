#!/usr/bin/env bash
# What a decode step asks of the host, counted without a GPU: peagle-generate on the CUDA
# emulator (cuda-emulator/README.md) with PEAGLE_EMULATOR_TRACE, which prints every operation a
# stream is given and every other driver call a step may repeat. On a small model a GPU step
# waits mostly on the host, and these are what the host issues: uploads, copies back,
# synchronizations, device copies and kernel launches, each a call into the driver and most a
# wait for the GPU; and allocations, frees, events and kernel lookups, host time each.
#   scripts/emulated_host_ops.sh [--check] [TOKENS]   plain decoding, EAGLE-3 K=3 and P-EAGLE K=7
#                                                     by CUDA graphs, and P-EAGLE K=7 without
#                                                     them (eager: the target's forward and the
#                                                     drafter's launched one kernel at a time),
#                                                     on the demo model, TOKENS (default 24)
#                                                     greedy tokens each
# Prints a table: for each mode, a middle step's operations by kind (outside its graphs), its
# waits for the GPU and its driver calls (scripts/host_ops.py). With --check (scripts/test.sh)
# it fails where a mode's step issues more than its limit below: lower a limit when a change
# takes operations or calls off a step.
set -euo pipefail
cd "$(dirname "$0")/.."
limits=()
if [ "${1:-}" = --check ]; then
    # Operations besides graph launches / waits for the GPU / driver calls, a middle step of
    # each mode.
    limits=(--at-most "no_speculation=5/1/4" --at-most "EAGLE-3_K=3=15/1/8" --at-most "P-EAGLE_K=7=11/1/8"
        --at-most "P-EAGLE_K=7_eager=155/1/321")
    shift
fi
tokens=${1:-24}
bash scripts/build_cuda_emulator.sh >/dev/null
bash scripts/build_cuda.sh --check >/dev/null
export LD_LIBRARY_PATH=$PWD/target/cuda-emulator/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
traces=target/cuda-emulator/host-ops
# A mode's trace of an earlier run would be counted as one of this run's.
rm -rf "$traces"
mkdir -p "$traces"
eagle3="--draft-model models/pystdlib-12l-eagle3 --k 3" peagle="--draft-model models/pystdlib-12l-peagle --k 7"
# Without graphs every step is alike from the second on: a third of the tokens (at least 8)
# makes enough.
eager=$((tokens / 3 > 8 ? tokens / 3 : 8))
# Each mode: its name, its tokens and its arguments.
modes=("no speculation|$tokens|--cuda-graphs" "EAGLE-3 K=3|$tokens|--cuda-graphs $eagle3"
    "P-EAGLE K=7|$tokens|--cuda-graphs $peagle" "P-EAGLE K=7 eager|$eager|$peagle")
# The modes run at once: each is one thread on the emulator, a minute or two.
runs=()
for mode in "${modes[@]}"; do
    name=${mode%%|*} rest=${mode#*|}
    # shellcheck disable=SC2086 # the mode's arguments are words
    # One sequence's steps are a few rows: at most 64 a step leaves out the graphs of larger
    # batches, whose capture at start-up took half of a run's time on the emulator.
    PEAGLE_EMULATOR_TRACE=1 target/cuda-check/release/peagle-generate --device cuda --max-batched-tokens 64 \
        --prompt "def fibonacci(n):" --max-tokens "${rest%%|*}" ${rest#*|} \
        >/dev/null 2>"$traces/${name// /_}.txt" &
    runs+=($!)
done
for run in "${runs[@]}"; do
    wait "$run" || { echo "emulated_host_ops.sh: a mode failed; the traces are in $traces" >&2; exit 1; }
done
python3 scripts/host_ops.py "${limits[@]}" "$traces"/*.txt

#!/usr/bin/env bash
# Trains the demo model's drafters end to end, as committed under models/:
#   1. capture: the demo model answers prompts cut from its train split (on-policy data);
#   2. fit: a P-EAGLE drafter (4 layers, 8 depths) and an EAGLE-3 drafter (1 layer);
#   3. measure: acceptance and tokens/s with peagle-generate on the held-out eval prompts
#      at K = 3, 5, 7, written next to each drafter as acceptance_k{K}.json.
# Stages can run alone: scripts/train_demo_drafters.sh [capture|peagle|eagle3|measure]...
# The capture and checkpoints live in $WORK (default /tmp/peagle_drafters) and resume.
set -euo pipefail
cd "$(dirname "$0")/.."

target=models/pystdlib-12l
work=${WORK:-/tmp/peagle_drafters}
examples=${EXAMPLES:-1100}
bin=target/release
stages=("${@:-capture peagle eagle3 measure}")

common=(--draft-vocab-size 4096 --seq-len 512 --batch-size 4 --val-fraction 0.03 --eval-every 25 --seed 0)
peagle_args=(--num-layers 4 --num-depths 8 --down-sample-ratio 0.7 --down-sample-ratio-min 0.2 --lr 6e-4
    --warmup-steps 20 --epochs "${PEAGLE_EPOCHS:-2}")
eagle3_args=(--num-layers 1 --num-depths 5 --lr 6e-4 --warmup-steps 20 --epochs 1)

cargo build --release --locked --bin peagle-train --bin peagle-generate

capture() {
    local resume=()
    [[ -f $work/capture/capture_progress.json ]] && resume=(--resume)
    "$bin/peagle-train" capture --model "$target" --data "$target/drafter_prompts.jsonl" \
        --out "$work/capture" --generate 160 --max-len 512 --limit "$examples" "${resume[@]}"
}

# fit ALGO OUT ARGS...: trains in $work/OUT (resuming), then copies the export to models/.
fit() {
    local algo=$1 out=$2
    shift 2
    local resume=()
    [[ -f $work/$out/checkpoint/state.json ]] && resume=(--resume)
    "$bin/peagle-train" fit --algo "$algo" --data "$work/capture" --out "$work/$out" "${common[@]}" "$@" \
        "${resume[@]}"
    mkdir -p "models/$out"
    cp "$work/$out"/{config.json,model.safetensors,train_report.json,accuracy.png} "models/$out/"
}

measure() {
    local prompts=$target/eval_prompts.jsonl
    local plain=("$bin/peagle-generate" --prompts-file "$prompts" --max-tokens 256)
    "${plain[@]}" --stats-json "$work/plain_before.json" >/dev/null
    for out in pystdlib-12l-peagle pystdlib-12l-eagle3; do
        local parallel=()
        [[ $out == *peagle ]] && parallel=(--parallel-drafting)
        for k in 3 5 7; do
            "$bin/peagle-generate" --prompts-file "$prompts" --max-tokens 256 --draft-model "models/$out" \
                "${parallel[@]}" --k "$k" --stats-json "models/$out/acceptance_k$k.json" >/dev/null
        done
    done
    "${plain[@]}" --stats-json "$work/plain_after.json" >/dev/null
    local card=(--plain "$work/plain_before.json" "$work/plain_after.json" --capture "$work/capture/data_config.json")
    python3 scripts/drafter_card.py models/pystdlib-12l-peagle "${card[@]}" \
        --command "peagle-train fit --algo peagle ${common[*]} ${peagle_args[*]}"
    python3 scripts/drafter_card.py models/pystdlib-12l-eagle3 "${card[@]}" \
        --command "peagle-train fit --algo eagle3 ${common[*]} ${eagle3_args[*]}"
}

for stage in ${stages[*]}; do
    case $stage in
        capture) capture ;;
        peagle) fit peagle pystdlib-12l-peagle "${peagle_args[@]}" ;;
        eagle3) fit eagle3 pystdlib-12l-eagle3 "${eagle3_args[@]}" ;;
        measure) measure ;;
        *) echo "unknown stage $stage (capture, peagle, eagle3, measure)" >&2; exit 1 ;;
    esac
done

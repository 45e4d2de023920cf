"""Writes the model card (README.md) of a drafter trained by scripts/train_demo_drafters.sh.

Every number comes from files the pipeline wrote next to the drafter: train_report.json
(peagle-train fit), acceptance_k{K}.json (peagle-generate --stats-json on the eval prompts)
and, for the speedup column, the stats of plain runs given with --plain (their mean tokens/s:
runs before and after the drafter runs bracket the drift of a shared machine).

    python3 scripts/drafter_card.py models/pystdlib-12l-peagle --plain /tmp/peagle_drafters/plain_{before,after}.json \
        --capture /tmp/peagle_drafters/capture/shard_*/data_config.json --generate 200 --command "..."

A drafter fitted in stages (each `--init-from` the export of the one before) names the reports
of the earlier stages with --earlier-report and gives one --command per stage, in order; its
own train_report.json is the last stage's.
"""

import argparse
import json
from pathlib import Path


def load(path):
    return json.loads(Path(path).read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("drafter", type=Path)
    ap.add_argument("--plain", type=Path, nargs="+", required=True,
                    help="stats JSONs of the same prompts without a drafter")
    ap.add_argument("--capture", type=Path, nargs="+", required=True,
                    help="data_config.json of each capture directory the drafter trained on")
    ap.add_argument("--generate", type=int, required=True, help="the capture's --generate")
    ap.add_argument("--command", required=True, action="append",
                    help="the fit command line, for the card; once per stage, in order")
    ap.add_argument("--earlier-report", type=Path, action="append", default=[],
                    help="train_report.json of each stage before the last, in order")
    ap.add_argument("--hardware", default="2 CPU cores (shared with other work)",
                    help="where the fit ran, for the card")
    args = ap.parse_args()

    d = args.drafter
    config, report = load(d / "config.json"), load(d / "train_report.json")
    reports = [load(p) for p in args.earlier_report] + [report]
    if len(reports) != len(args.command):
        ap.error(f"{len(args.command)} --command for {len(reports)} stage(s)")
    shards = [load(p) for p in args.capture]
    capture = dict(shards[0])
    for key in ("num_samples", "num_tokens", "num_loss_tokens"):
        capture[key] = sum(c[key] for c in shards)
    plain_runs = [load(p)["tokens_per_second"] for p in args.plain]
    plain_speed = sum(plain_runs) / len(plain_runs)
    plain_note = "one run" if len(plain_runs) == 1 else "the mean of " + ", ".join(f"{x:.0f}" for x in plain_runs)
    if len(plain_runs) == 2:
        plain_note += " before and after the drafter runs"
    layers = config["transformer_layer_config"]["num_hidden_layers"]
    algo = config["speculators_model_type"]
    last = report["history"][-1]
    size_mb = (d / "model.safetensors").stat().st_size / 1e6
    name = {"peagle": "P-EAGLE", "eagle3": "EAGLE-3"}[algo]
    mode = "--parallel-drafting " if algo == "peagle" else ""

    rows = []
    for k in (3, 5, 7):
        s = load(d / f"acceptance_k{k}.json")
        per_pos = ", ".join(f"{a:.2f}" for a in s["per_position_acceptance"])
        speed = s["tokens_per_second"] / plain_speed
        rows.append(
            f"| {k} | {s['mean_acceptance_length']:.2f} | {per_pos} | "
            f"{s['tokens_per_second']:.0f} | {speed:.2f}x |"
        )
    depth_acc = " | ".join(f"{a:.3f}" for a in last["val_accuracy"])
    depth_meaning = {
        "peagle": "Depth d is the token d + 1 steps ahead, drafted from mask slots in the same pass "
        "without the tokens between: what parallel drafting has to guess.",
        "eagle3": "Depth d is training-time-test step d: the true tokens so far are fed in with the "
        "drafter's own hidden state, so this is the accuracy given that the earlier drafts were "
        "right (the only case in which the draft counts).",
    }[algo]
    depth_head = " | ".join(str(i) for i in range(len(last["val_accuracy"])))
    if len(reports) == 1:
        commands = f"`{args.command[0]}`"
    else:
        stages = [
            f"{i + 1}. `{cmd}`: {r['step']} steps, {r['seconds'] / 60:.1f} minutes, validation loss "
            f"{r['history'][-1]['val_loss']:.3f} at the end"
            for i, (r, cmd) in enumerate(zip(reports, args.command))
        ]
        commands = (f"In {len(reports)} stages, each from the export of the one before (`--init-from`, "
                    "with a fresh optimizer and schedule):\n\n" + "\n".join(stages))
    plots = "`accuracy.png` plots it over training; `train_report.json` has every evaluation."
    if len(reports) > 1:
        earlier = ", ".join(f"`{p.name}`" for p in args.earlier_report)
        plots = ("`accuracy.png` plots it over the last stage; `train_report.json` has every evaluation "
                 f"of that stage, {earlier} those of the stages before.")
    steps = sum(r["step"] for r in reports)
    minutes = sum(r["seconds"] for r in reports) / 60

    card = f"""# {d.name}: {name} drafter for pystdlib-12l

A {layers}-layer {name} drafter for the demo model `models/pystdlib-12l`, trained with
`peagle-train` and exported in the speculators format
(`speculators_model_type: {algo}`), so both peagle and vLLM load it.

```sh
cargo run --release --bin peagle-generate -- --draft-model models/{d.name} {mode}--k 5 \\
  --prompt "def fibonacci(n):"
```

## Data

On-policy: the demo model itself answered {capture['num_samples']} prompts cut from the
**train split** of its corpus (`models/pystdlib-12l/drafter_prompts.jsonl.xz`, made by
`scripts/make_drafter_prompts.py`; no held-out file, no eval prompt) with up to {args.generate}
greedy tokens each. {capture['num_tokens']} tokens in all, {capture['num_loss_tokens']} of them
learned (the responses). Captured target layers: {capture['aux_layer_ids']} and the final
pre-norm state.

## Training

{commands}

- {report['num_parameters'] / 1e6:.2f}M trainable parameters (embeddings, fc, layers, norm,
  lm_head{', mask_hidden' if algo == 'peagle' else ''}); draft vocabulary
  {config['draft_vocab_size']} of {config['transformer_layer_config']['vocab_size']} tokens
  (the most frequent learned ones); lm_head initialised from the target's rows.
- {steps} AdamW steps of 4 samples ({report['train_samples']} training samples,
  {report['val_samples']} held out for validation), warmup then cosine decay, gradient clipping
  at 1.0, KL loss against the target's distribution in f32.
- {minutes:.1f} minutes on {args.hardware}.
- Weights stored as bf16: {size_mb:.1f} MB.

Validation at the end (loss {last['val_loss']:.3f}), accuracy of the drafter's greedy token
against the target's, per depth:

| depth | {depth_head} |
| --- | {' | '.join('---' for _ in last['val_accuracy'])} |
| accuracy | {depth_acc} |

{depth_meaning}

{plots}

## Acceptance on the eval prompts

peagle-generate, greedy, the 100 held-out prompts of `models/pystdlib-12l/eval_prompts.jsonl`,
256 new tokens each, on the same CPU as the plain runs ({plain_speed:.0f} tokens/s without a
drafter, {plain_note}). Mean acceptance length counts the bonus token (vLLM's
definition); tokens/s vary with machine load, compare them within one table only.

| K | mean acceptance length | per-position acceptance | tokens/s | vs no drafter |
| --- | --- | --- | --- | --- |
{chr(10).join(rows)}

Greedy output with this drafter equals the target's alone, token for token
(`crates/peagle-engine/tests/demo_model.rs`).

Reproduce: `scripts/train_demo_drafters.sh` (capture, both drafters, measurement).
"""
    (d / "README.md").write_text(card)
    print(f"wrote {d / 'README.md'}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Cut prompts for drafter training from the TRAIN split of the demo model's corpus.

The drafter learns to predict what the target model would write next, so its
training data should be the target's own continuations (on-policy data). This
script only writes the prompts; ``peagle-train capture --generate N`` then lets
the target (``models/pystdlib-12l``) write the responses and captures them.

Prompts are cut exactly like the eval prompts in ``eval_prompts.jsonl``: a
function/method signature plus its docstring, or a signature plus the first
lines of the body (``extract_prompts`` in ``train_demo_model.py``, reused
here). The difference is that they come ONLY from train-split files, so the
held-out files (``heldout_files.txt``), and with them the eval prompts, stay
unseen by the drafter as well as by the target. Exact duplicate prompts, and
prompts identical to an eval prompt, are dropped.

Usage::

    python scripts/make_drafter_prompts.py                   # 20000 prompts
    python scripts/make_drafter_prompts.py --num-prompts 500 --out /tmp/p.jsonl

Output: one ``{"prompt": "..."}`` object per line. The repository keeps it compressed
(``xz -9k``, ``drafter_prompts.jsonl.xz``), which keeps the tree small enough to travel with
the GPU binaries to a GPU host. The output is deterministic:
files are taken in sorted order, and prompts are picked in the order of a fixed
SHA-1 of ``file:line``, so no RNG seed is needed.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_demo_model as tdm  # noqa: E402  (reuse the corpus split and prompt cutter)

from tokenizers import Tokenizer  # noqa: E402

MODEL = tdm.REPO / "models" / "pystdlib-12l"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-prompts", type=int, default=20000)
    ap.add_argument("--max-tokens", type=int, default=400, help="token limit per prompt (BOS included)")
    ap.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--out", default=str(MODEL / "drafter_prompts.jsonl"))
    args = ap.parse_args()

    stdlib = Path(args.stdlib)
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    heldout = set((MODEL / "heldout_files.txt").read_text().splitlines())
    files, _ = tdm.collect_corpus(stdlib)
    if {r for r, _ in files if tdm.is_heldout(r)} != heldout:
        # A different Python version has a different stdlib. The hash split still keeps
        # held-out paths out, but some prompts may then come from files the target never saw.
        print("warning: this stdlib's held-out split differs from heldout_files.txt", file=sys.stderr)
    # The hash split decides which files are train files; also drop the listed
    # held-out files explicitly, as a second guard.
    train = [r for r, _ in files if not tdm.is_heldout(r) and r not in heldout]

    # Boilerplate methods repeat word for word across stdlib files, and a few equal an
    # eval prompt. Drop those so that no eval prompt's continuation leaks into drafter
    # training, and no capture budget goes to duplicates.
    eval_texts = {json.loads(l)["prompt"] for l in open(MODEL / "eval_prompts.jsonl")}

    # Take at most 3 prompts per file, so that a few huge modules don't dominate.
    # Allow more per file only if 3 is not enough to reach the requested count.
    cap, extra = 3, 0
    while True:
        target = args.num_prompts + extra
        picked = tdm.extract_prompts(stdlib, train, tok, n_target=target,
                                     max_tokens=args.max_tokens, max_per_file=cap)
        seen, prompts = set(eval_texts), []
        for p in picked:
            if p["prompt"] not in seen:
                seen.add(p["prompt"])
                prompts.append(p)
        short = args.num_prompts - len(prompts)
        if short <= 0 or cap >= 50:
            break
        if len(picked) < target:  # the pool ran out at this cap
            cap *= 2
        extra += short  # ask for as many more as were dropped
    prompts = prompts[: args.num_prompts]

    used = {p["file"] for p in prompts}
    assert not used & heldout, f"held-out files used: {sorted(used & heldout)}"
    assert all(p["n_tokens"] <= args.max_tokens for p in prompts)

    with open(args.out, "w") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p["prompt"]}) + "\n")
    n_doc = sum(p["kind"] == "docstring" for p in prompts)
    print(f"{len(prompts)} prompts ({n_doc} docstring, {len(prompts) - n_doc} head) from "
          f"{len(used)} of {len(train)} train files (max {cap}/file) -> {args.out}")


if __name__ == "__main__":
    main()

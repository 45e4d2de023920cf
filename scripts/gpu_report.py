"""Assembles scripts/gpu_check.sh's results directory into report.json and report.md."""

import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(out):
    report = {"steps": open(os.path.join(out, "steps.log")).read().splitlines()}
    gpu = open(os.path.join(out, "gpu.csv")).read().strip() if os.path.exists(os.path.join(out, "gpu.csv")) else "?"
    report["gpu"] = gpu
    md = ["# GPU check", "", "```", gpu, "```", "", "## Steps", ""]
    md += [f"- {line}" for line in report["steps"]]

    sweep = load(os.path.join(out, "demo-sweep", "sweep.json"))
    if sweep:
        rows = {}
        for run in sweep["runs"]:
            mode = run["mode"]["name"] + (f" K={run['mode']['k']}" if run["mode"]["k"] else "")
            for level in run["result"]["levels"]:
                rows.setdefault(level["concurrency"], {})[mode] = level
        report["demo"] = {c: {m: {"output_tokens_per_s": l["output_throughput"],
                                  "acceptance_length": l["acceptance_length"],
                                  "tpot_ms_p50": (l.get("tpot_ms") or {}).get("p50")}
                              for m, l in modes.items()} for c, modes in rows.items()}
        modes = sorted({m for r in rows.values() for m in r})
        md += ["", "## Demo model (peagle-bench sweep, greedy, 128 new tokens)", "",
               "| concurrency | " + " | ".join(modes) + " |", "| ---: |" + " ---: |" * len(modes)]
        for c in sorted(rows):
            plain = next((l["output_throughput"] for m, l in rows[c].items() if m.startswith("no spec")), None)
            cells = []
            for m in modes:
                l = rows[c].get(m)
                if not l:
                    cells.append("-")
                    continue
                cell = f"{l['output_throughput']:.0f}"
                if plain and not m.startswith("no spec"):
                    cell += f" ({l['output_throughput'] / plain:.2f}x"
                    cell += f", acc {l['acceptance_length']:.2f})" if l["acceptance_length"] else ")"
                cells.append(cell)
            md.append(f"| {c} | " + " | ".join(cells) + " |")

    gemm_path = os.path.join(out, "gemm-vs-cublas.jsonl")
    if os.path.exists(gemm_path):
        rows = [json.loads(line) for line in open(gemm_path) if line.strip()]
        report["gemm_vs_cublas"] = rows
        md += ["", "## Batch-invariant matmul against cuBLAS (bf16, 4096 -> 14336)", "",
               "| M | invariant ms | cuBLAS ms | ratio | invariant weight GB/s |", "| ---: | ---: | ---: | ---: | ---: |"]
        md += [f"| {r['m']} | {r['invariant_ms']:.3f} | {r['cublas_ms']:.3f} | {r['ratio']:.2f}x | "
               f"{r['invariant_weight_gb_per_s']:.0f} |" for r in rows]

    peer = load(os.path.join(out, "transformers.json"))
    ours = load(os.path.join(out, "peagle-generate-demo.json"))
    if peer and ours:
        report["peer"] = {"transformers": peer, "peagle_generate": ours,
                          "ratio": ours["tokens_per_second"] / peer["tokens_per_second"]}
        md += ["", "## Against transformers (demo model, one prompt at a time, 128 greedy tokens)", "",
               f"- {peer['peer']}: {peer['tokens_per_second']:.0f} tokens/s",
               f"- peagle-generate --device cuda: {ours['tokens_per_second']:.0f} tokens/s "
               f"({report['peer']['ratio']:.2f}x)"]

    bound = load(os.path.join(out, "llama-8b-bound.json"))
    decode = load(os.path.join(out, "llama-8b-decode.json"))
    if bound and decode:
        times = decode["step_times"]
        step = times["target_seconds"] / times["steps"] if times.get("steps") else None
        report["llama_8b"] = {"bound": bound, "decode": decode, "target_seconds_per_step": step}
        md += ["", "## Llama-8B-shaped random bf16 target, one decode step", "",
               f"- weight bytes read per step: {bound['weight_bytes'] / 1e9:.2f} GB",
               f"- copy bandwidth measured in the same run: {bound['copy_bytes_per_second'] / 1e12:.2f} TB/s",
               f"- HBM bound: {bound['bound_seconds'] * 1e3:.2f} ms"]
        if step:
            report["llama_8b"]["ratio_to_bound"] = step / bound["bound_seconds"]
            md.append(f"- peagle target forward per decode step: {step * 1e3:.2f} ms "
                      f"({step / bound['bound_seconds']:.2f}x the bound); "
                      f"{decode['tokens_per_second']:.1f} tokens/s end to end")

    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main(sys.argv[1])

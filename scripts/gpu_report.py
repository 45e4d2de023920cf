"""Assembles scripts/gpu_check.sh's results directory into report.json and report.md."""

import csv
import json
import os
import sys

# HumanEval acceptance lengths published for gpt-oss-20b (the P-EAGLE paper and AWS's blog): the
# tokens a step commits with each trained head. The gpt-oss bench's drafters are random and
# accept nothing, so it measures step times and projects tokens/s from these.
PUBLISHED_ACCEPTANCE = {"EAGLE-3 K=3": 2.65, "P-EAGLE K=7": 3.94}  # keyed by peagle-bench's mode names
# The gpt-oss bench's targets on an H100.
HBM_SHARE_TARGET = 0.5  # plain decode at concurrency 1, as a share of the HBM bound
PEAGLE_OVER_EAGLE3_TARGET = 1.5  # projected, at concurrency 1
NO_SPECULATION = "no speculation"  # peagle-bench's name of the mode without a drafter


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ms_or_dash(row, key):
    """A time in ms, or "-" where a row from an older run has none."""
    return f"{row[key]:.3f}" if key in row else "-"


def load_lines(path):
    """The JSON lines of a file (none where there is no file); a line cut short by a step's time
    limit is left out."""
    if not os.path.exists(path):
        return []
    rows = []
    for line in open(path):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def main(out):
    report = {"steps": open(os.path.join(out, "steps.log")).read().splitlines()}
    gpu = open(os.path.join(out, "gpu.csv")).read().strip() if os.path.exists(os.path.join(out, "gpu.csv")) else "?"
    report["gpu"] = gpu
    md = ["# GPU check", "", "```", gpu, "```", "", "## Steps", ""]
    md += [f"- {line}" for line in report["steps"]]

    for name, title in (("demo-sweep", "Demo model"), ("demo-sweep-graphs", "Demo model by CUDA graphs")):
        demo, section = demo_sweep(out, name, title)
        if demo:
            report[name.replace("-", "_")] = demo
            md += section

    rows = load_lines(os.path.join(out, "gemm-vs-cublas.jsonl"))
    if rows:
        report["gemm_vs_cublas"] = rows
        md += ["", "## Batch-invariant matmul against cuBLAS (bf16, 4096 -> 14336)", "",
               "Tensor cores: kernels/linear_mma.cu (the default); CUDA cores: kernels/linear.cu "
               "(`PEAGLE_CUDA_MATMUL=fma`).", "",
               "Tensor cores ms is the form M picks (narrow up to 8 rows, wide above, staged from 64 rows where that "
               "makes 256 blocks of 64 x 64: from 128 rows here); "
               "every form gives the same bits, and all are timed side by side. SwiGLU: the same weight as a fused gate/up "
               "projection (7168 gate and 7168 up rows), gated in the matmul's launch (fused) or by a "
               "launch of kernels/swiglu.cu after it (apart), on the tensor cores; both give the same bits. FP8: the "
               "same weight in block-scaled e4m3 (blocks of 128 x 128), half the bytes, by each kernel.", "",
               "| M | CUDA cores ms | tensor cores ms | narrow ms | wide ms | staged ms | cuBLAS ms | CUDA cores / cuBLAS | "
               "tensor cores / cuBLAS | CUDA cores weight GB/s | tensor cores weight GB/s | SwiGLU fused ms | "
               "SwiGLU apart ms | FP8 CUDA cores ms | FP8 tensor cores ms |",
               "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        md += [f"| {r['m']} | {r['fma_ms']:.3f} | {r['mma_ms']:.3f} | {ms_or_dash(r, 'mma_narrow_ms')} | "
               f"{ms_or_dash(r, 'mma_wide_ms')} | {ms_or_dash(r, 'mma_staged_ms')} | {r['cublas_ms']:.3f} | {r['fma_ratio']:.2f}x | {r['mma_ratio']:.2f}x | "
               f"{r['fma_weight_gb_per_s']:.0f} | {r['mma_weight_gb_per_s']:.0f} | "
               f"{ms_or_dash(r, 'swiglu_fused_ms')} | {ms_or_dash(r, 'swiglu_apart_ms')} | "
               f"{ms_or_dash(r, 'fp8_fma_ms')} | {ms_or_dash(r, 'fp8_mma_ms')} |" for r in rows]

    lines = load_lines(os.path.join(out, "moe-experts.jsonl"))
    rows = [r for r in lines if not r.get("dense")]
    dense = [r for r in lines if r.get("dense")]
    if rows:
        report["moe_experts"] = rows
        md += ["", "## gpt-oss-shaped MXFP4 experts (32 of 2880 x 2880, top 4, bf16 rows)", "",
               "kernels/moe_mxfp4_mma.cu on the tensor cores in tiles of 8 pairs of an expert (narrow) and of 32 "
               "(wide; the default where a batch gives the average expert more than 8), and on the CUDA "
               "cores (`PEAGLE_CUDA_MATMUL=fma`, kernels/moe_mxfp4.cu). Weight GB/s: the bytes of the experts the batch touches "
               "over the time.", "",
               "| rows | experts touched | narrow ms | wide ms | CUDA cores ms | wide / narrow | "
               "narrow weight GB/s | wide weight GB/s |",
               "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        md += [f"| {r['rows']} | {r['experts_touched']} | {r['narrow_ms']:.3f} | {r['wide_ms']:.3f} | "
               f"{r['fma_ms']:.3f} | {r['wide_over_narrow']:.2f}x | {r['narrow_weight_gb_per_s']:.0f} | "
               f"{r['wide_weight_gb_per_s']:.0f} |" for r in rows]
    if dense:
        report["dense_experts"] = dense
        md += ["", "## Qwen3-30B-A3B-shaped dense experts (128 of 2048 x 768, top 8, bf16 rows)", "",
               "kernels/moe_dense.cu on the tensor cores in tiles of 8 pairs of an expert (narrow) and of 32 "
               "(wide; the default where a batch gives the average expert more than 8), the weights in bf16 "
               "or in FP8 blocks of 128 x 128; kernels/moe.cu routes and combines. Weight GB/s: the bytes of "
               "the experts the batch touches over the time.", "",
               "| weights | rows | experts touched | narrow ms | wide ms | wide / narrow | narrow weight GB/s | "
               "wide weight GB/s |",
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        md += [f"| {r.get('weights', 'bf16')} | {r['rows']} | {r['experts_touched']} | {r['narrow_ms']:.3f} | {r['wide_ms']:.3f} | "
               f"{r['wide_over_narrow']:.2f}x | {r['narrow_weight_gb_per_s']:.0f} | "
               f"{r['wide_weight_gb_per_s']:.0f} |" for r in dense]

    rows = load_lines(os.path.join(out, "paged-attention.jsonl"))
    if rows:
        report["paged_attention"] = rows
        md += ["", "## Paged attention (bf16 queries and cache)", "",
               "kernels/paged_attention.cu at gpt-oss-20b's heads (64 query, 8 KV, head_dim 64, sinks) and "
               "Llama-8B's (32, 8, 128). KV GB/s: the keys and values the sequences hold (each row's window) "
               "over the time, the least a launch reads; walked GB/s: what its rows attend over, each query "
               "row's head its KV head's window, over the time (a block a row would read all of it, mostly "
               "from L2; the rows or heads a block groups share their reads). One block a row: the time "
               "with one block for each head and row (or group of rows, under full attention), walking the "
               "row's parts of the keys, where the launch gives a long row's parts to several blocks and a "
               "row's heads of one KV head to one. Heads grouped: the time with a row's query heads of one "
               "KV head in one block wherever rows do not share one, where the launch gives them a block "
               "each (it groups them only where a block a head would more than fill the GPU).", "",
               "| model | sequences | rows each | context | window | ms | one block a row | heads grouped | "
               "KV MB | KV GB/s | walked GB/s |",
               "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]

        def against(r, key):
            """A comparison's time and its ratio to the launch's own, or "-" where an older run has none."""
            return f"{r[key]:.3f} ({r[key] / r['ms']:.2f}x)" if key in r else "-"

        md += [f"| {r['model']} | {r['sequences']} | {r['rows_each']} | {r['context']} | "
               f"{r['window'] if r['window'] is not None else '-'} | {r['ms']:.3f} | "
               f"{against(r, 'one_block_ms')} | {against(r, 'head_groups_ms')} | {r['kv_mb']:.1f} | "
               f"{r['kv_gb_per_s']:.0f} | {r['walked_gb_per_s']:.0f} |" for r in rows]

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
        report["llama_8b"] = {"bound": bound, **decode_step(decode, bound)}
        md += ["", "## Llama-8B-shaped random bf16 target, one decode step", "",
               f"- weight bytes read per step: {bound['weight_bytes'] / 1e9:.2f} GB",
               f"- copy bandwidth measured in the same run: {bound['copy_bytes_per_second'] / 1e12:.2f} TB/s",
               f"- HBM bound: {bound['bound_seconds'] * 1e3:.2f} ms"]
        for key in ("graphs", "fma"):
            run = load(os.path.join(out, f"llama-8b-decode-{key}.json"))
            if run:
                report["llama_8b"][key] = decode_step(run, bound)
        for label, part in (("without CUDA graphs", report["llama_8b"]),
                            ("with CUDA graphs", report["llama_8b"].get("graphs")),
                            ("by the CUDA-core matmul (PEAGLE_CUDA_MATMUL=fma), without CUDA graphs",
                             report["llama_8b"].get("fma"))):
            if part and part["step_seconds"]:
                md.append(f"- {label}: an engine step {part['step_seconds'] * 1e3:.2f} ms "
                          f"({part['ratio_to_bound']:.2f}x the bound), of which the target's forward "
                          f"{part['target_seconds_per_step'] * 1e3:.2f} ms; "
                          f"{part['decode']['tokens_per_second']:.1f} tokens/s end to end")

    for suffix, key in (("", "gpt_oss"), ("-fma", "gpt_oss_fma")):
        gpt, section = gpt_oss(out, suffix)
        if gpt:
            report[key] = gpt
            md += section

    profiles, section = kernel_profiles(out)
    if profiles:
        report["kernel_profiles"] = profiles
        md += section

    graphs, section = graph_gains(out)
    if graphs:
        report["cuda_graphs"] = graphs
        md += section

    targets, section = backend_targets(report)
    report["cuda_backend_targets"] = targets
    md += section

    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


def demo_sweep(out, name, title):
    """The demo model's sweep in `out/name`: output tokens/s per concurrency and mode, the
    means over the sweep's repeats, and each against no speculation. report.json's part (None
    when the sweep did not finish) and report.md's lines."""
    sweep = load(os.path.join(out, name, "sweep.json"))
    if not sweep or not sweep.get("rows"):
        return None, []
    rows = {}
    for r in sweep["rows"]:
        rows.setdefault(r["concurrency"], {})[r["mode"]["name"]] = {
            "output_tokens_per_s": r["mean_output_throughput"], "vs_no_speculation": r["vs_no_speculation"],
            "acceptance_length": r["acceptance_length"]}
    modes = sorted({m for levels in rows.values() for m in levels}, key=lambda m: (m != NO_SPECULATION, m))
    md = ["", f"## {title} (peagle-bench sweep, greedy, 128 new tokens)", "",
          "Output tokens/s, means over the sweep's repeats; in brackets, against no speculation and the "
          "acceptance length.", "",
          "| concurrency | " + " | ".join(modes) + " |", "| ---: |" + " ---: |" * len(modes)]
    for c in sorted(rows):
        cells = []
        for m in modes:
            level = rows[c].get(m)
            if not level:
                cells.append("-")
                continue
            cell = f"{level['output_tokens_per_s']:.0f}"
            if m != NO_SPECULATION and level["vs_no_speculation"]:
                cell += f" ({level['vs_no_speculation']:.2f}x"
                cell += f", acc {level['acceptance_length']:.2f})" if level["acceptance_length"] else ")"
            cells.append(cell)
        md.append(f"| {c} | " + " | ".join(cells) + " |")
    return rows, md


def backend_targets(report):
    """The CUDA backend's targets on an H100, each met or not by this run's numbers, without
    CUDA graphs and with them where both ran. report.json's part and report.md's lines."""
    def tokens(sweep, c, mode):
        return (((report.get(sweep) or {}).get(c) or {}).get(mode) or {}).get("output_tokens_per_s")

    def ratio(a, b):
        return a / b if a and b else None

    def slowest_speculation(sweep):
        ratios = [level["vs_no_speculation"] for levels in (report.get(sweep) or {}).values()
                  for m, level in levels.items() if m != NO_SPECULATION and level["vs_no_speculation"]]
        return min(ratios) if ratios else None

    llama = report.get("llama_8b") or {}
    targets = [
        ("8B-shaped decode step at most 1.25x the HBM bound (lower is better)",
         llama.get("ratio_to_bound"), (llama.get("graphs") or {}).get("ratio_to_bound"), 1.25, False),
        ("demo model, no speculation: at least 3x transformers' tokens/s",
         (report.get("peer") or {}).get("ratio"), None, 3.0, True),
    ]
    for label, mode, threshold in (("EAGLE-3 K=3", "EAGLE-3 K=3", 1.5), ("no speculation", NO_SPECULATION, 2.5)):
        targets.append((f"demo model at concurrency 1: P-EAGLE K=7 at least {threshold}x {label}",
                        ratio(tokens("demo_sweep", 1, "P-EAGLE K=7"), tokens("demo_sweep", 1, mode)),
                        ratio(tokens("demo_sweep_graphs", 1, "P-EAGLE K=7"), tokens("demo_sweep_graphs", 1, mode)),
                        threshold, True))
    targets.append(("demo model: no speculative mode slower than no speculation at any concurrency (the slowest)",
                    slowest_speculation("demo_sweep"), slowest_speculation("demo_sweep_graphs"), 1.0, True))

    def verdict(value, threshold, higher):
        if value is None:
            return "not measured"
        met = value >= threshold if higher else value <= threshold
        return f"{value:.2f}x, {'met' if met else 'not met'}"

    md = ["", "## The CUDA backend's targets (H100)", "",
          "| target | without CUDA graphs | with CUDA graphs |", "| --- | --- | --- |"]
    data = []
    for text, eager, graphs, threshold, higher in targets:
        md.append(f"| {text} | {verdict(eager, threshold, higher)} | "
                  f"{verdict(graphs, threshold, higher) if graphs is not None else '-'} |")
        data.append({"target": text, "threshold": threshold, "value": eager, "value_with_graphs": graphs})
    return data, md


def decode_step(decode, bound):
    """peagle-generate's stats for a decode run: the engine step (every phase, the prompt's
    one prefill step among them) and the target's forward, each a mean per step, against the
    HBM bound."""
    times = decode["step_times"]
    steps = times.get("steps")
    step = sum(times[k] for k in ("target_seconds", "drafter_seconds", "verify_seconds", "other_seconds")) / steps \
        if steps else None
    return {"decode": decode, "step_seconds": step,
            "target_seconds_per_step": times["target_seconds"] / steps if steps else None,
            "ratio_to_bound": step / bound["bound_seconds"] if step else None}


def step_ms(row):
    """A sweep row's engine time per step over all phases; None where the server exported none."""
    e = row["engine"]
    return e["target_ms"] + e["drafter_ms"] + e["verify_ms"] + e["other_ms"] if e else None


def projected_at_bound(bound):
    """P-EAGLE K=7's projected tokens/s over EAGLE-3 K=3's with each step at the HBM bound of
    its verification window (K + 1 rows, `window_bytes` of make_random_gpt_oss.py) and the
    drafters free: the most the published acceptance lengths can give on this model; None
    without the window bytes."""
    windows = (bound or {}).get("window_bytes")
    if not windows:
        return None
    per_byte = {name: accepted / windows[str(int(name.split("K=")[1]) + 1)]
                for name, accepted in PUBLISHED_ACCEPTANCE.items()}
    return per_byte["P-EAGLE K=7"] / per_byte["EAGLE-3 K=3"]


def gpt_oss(out, suffix=""):
    """The gpt-oss-20b-shaped bench: report.json's part (None when none of it finished) and
    report.md's lines; with suffix "-fma", the sweeps run on the CUDA-core matmul."""
    bound = load(os.path.join(out, "gpt-oss-bound.json"))
    c1 = load(os.path.join(out, f"gpt-oss-sweep-c1{suffix}", "sweep.json")) or {"rows": []}
    batched = load(os.path.join(out, f"gpt-oss-sweep{suffix}", "sweep.json")) or {"rows": []}
    if suffix and not (c1["rows"] or batched["rows"]):
        return None, []
    # The concurrency-1 sweep's other level only warms its servers; a mode that failed a level
    # has no numbers there.
    rows = [r for r in c1["rows"] if r["concurrency"] == 1] + batched["rows"]
    rows = [r for r in rows if r["output_throughput"]]
    if not rows and not bound:
        return None, []
    # Columns in the sweep's order of modes, whichever of them failed.
    modes = {r["mode"]["name"]: r["mode"] for r in rows}
    order = {"none": 0, "eagle3": 1, "peagle": 2}
    names = sorted(modes, key=lambda n: (order[modes[n]["method"]], modes[n]["k"]))
    max_tokens = (batched.get("config") or c1.get("config") or {}).get("workload", {}).get("max_tokens", "?")
    levels = {}
    for r in rows:
        accepted = 1.0 if r["mode"]["method"] == "none" else PUBLISHED_ACCEPTANCE.get(r["mode"]["name"])
        step = step_ms(r)
        levels.setdefault(r["concurrency"], {})[r["mode"]["name"]] = {
            "plain": r["mode"]["method"] == "none", "output_tokens_per_s": r["mean_output_throughput"],
            "engine_ms_per_step": r["engine"], "step_ms": step,
            "projected_tokens_per_s": 1e3 * accepted / step if accepted and step else None}
    for modes in levels.values():
        plain = next((m["projected_tokens_per_s"] for m in modes.values() if m["plain"]), None)
        for m in modes.values():
            m["projected_vs_plain"] = m["projected_tokens_per_s"] / plain if m["projected_tokens_per_s"] and plain else None

    def projected(c, name):
        return levels.get(c, {}).get(name, {}).get("projected_tokens_per_s")

    def peagle_over_eagle3(c):
        peagle, eagle3 = projected(c, "P-EAGLE K=7"), projected(c, "EAGLE-3 K=3")
        return peagle / eagle3 if peagle and eagle3 else None

    md = ["", "## gpt-oss-20b-shaped random MXFP4 target" + (" on the CUDA cores (PEAGLE_CUDA_MATMUL=fma)" if suffix else "")]
    if rows:
        md += ["", f"peagle-bench sweep, every step drafting K (`--fixed-k`), {max_tokens} new tokens a request. "
                   "Output tokens/s: the drafters are random and accept next to nothing, so these are what each "
                   "mode's steps cost; the projection further down puts published acceptance lengths on them.", "",
               "| concurrency | " + " | ".join(names) + " |", "| ---: |" + " ---: |" * len(names)]
    for c in sorted(levels):
        cells = [f"{levels[c][n]['output_tokens_per_s']:.1f}" if n in levels[c] else "-" for n in names]
        md.append(f"| {c} | " + " | ".join(cells) + " |")

    plain_c1 = next((m for m in levels.get(1, {}).values() if m["plain"] and m["step_ms"]), None)
    hbm_share = bound["bound_seconds_per_token"] * 1e3 / plain_c1["step_ms"] if bound and plain_c1 else None
    if bound:
        md += ["", f"- bytes a decode token reads (the active experts in MXFP4, attention, router, norms, "
                   f"lm_head, one embedding row): {bound['bytes_per_token'] / 1e9:.2f} GB",
               f"- copy bandwidth measured on {bound['device']} in the same run: "
               f"{bound['copy_bytes_per_second'] / 1e12:.2f} TB/s; HBM bound "
               f"{bound['bound_seconds_per_token'] * 1e3:.3f} ms a token"]
    if hbm_share:
        md.append(f"- no speculation at concurrency 1: {plain_c1['step_ms']:.3f} ms an engine step, "
                  f"{100 * hbm_share:.0f}% of the bound")
    at_bound = projected_at_bound(bound)
    if at_bound:
        md.append(f"- at the HBM bound, each step reading its verification window's bytes and its drafter "
                  f"free: P-EAGLE K=7 over EAGLE-3 K=3 projected {at_bound:.2f}x (a window of 8 rows reads "
                  f"{bound['window_bytes']['8'] / 1e9:.2f} GB, one of 4 {bound['window_bytes']['4'] / 1e9:.2f} GB: "
                  "each expert any of its rows routes to, as a random router spreads them)")

    timed = [(c, n, m) for c in sorted(levels) for n, m in levels[c].items() if m["step_ms"]]
    if timed:
        md += ["", "Engine time per step by phase (ms; means over each level's steps, its prompts' "
                   "prefill included; the target column holds the device's choices of the step's rows, "
                   "issued behind its forward; a steady decode step's drafter kernels run while the host issues "
                   "the next step, so their GPU time is in the next step's target column and the drafter "
                   "column is the host's time to issue them):", "",
               "| concurrency | mode | steps | target | drafter | verify | other | total |",
               "| ---: | --- |" + " ---: |" * 6]
        for c, n, m in timed:
            e = m["engine_ms_per_step"]
            md.append(f"| {c} | {n} | {e['steps']:.0f} | {e['target_ms']:.3f} | {e['drafter_ms']:.3f} | "
                      f"{e['verify_ms']:.3f} | {e['other_ms']:.3f} | {m['step_ms']:.3f} |")
        published = ", ".join(f"{n} {a}" for n, a in PUBLISHED_ACCEPTANCE.items())
        md += ["", f"Projected from the published HumanEval acceptance lengths ({published}): a sequence's "
                   "tokens/s = acceptance length / time per step (no speculation: 1 / time per step); in "
                   "brackets, over no speculation.", "",
               "| concurrency | " + " | ".join(names) + " | P-EAGLE K=7 over EAGLE-3 K=3 |",
               "| ---: |" + " ---: |" * (len(names) + 1)]
        for c in sorted(levels):
            cells = []
            for n in names:
                m = levels[c].get(n, {})
                cell = f"{m['projected_tokens_per_s']:.1f}" if m.get("projected_tokens_per_s") else "-"
                if m.get("projected_vs_plain") and not m["plain"]:
                    cell += f" ({m['projected_vs_plain']:.2f}x)"
                cells.append(cell)
            ratio = peagle_over_eagle3(c)
            md.append(f"| {c} | " + " | ".join(cells) + f" | {f'{ratio:.2f}x' if ratio else '-'} |")

    # The policy sweep: k left to the speculation policy, as a server chooses it by default.
    policy = load(os.path.join(out, f"gpt-oss-sweep-policy{suffix}", "sweep.json")) or {"rows": []}
    policy_levels = {}
    for r in policy["rows"]:
        if r["output_throughput"]:
            policy_levels.setdefault(r["concurrency"], {})[r["mode"]["name"]] = r["mean_output_throughput"]
    if policy_levels:
        md += ["", "With k left to the speculation policy (no `--fixed-k`: the server's default), output "
                   "tokens/s; in brackets, over no speculation. The drafters accept next to nothing, so the "
                   "policy must find that drafting does not pay and keep plain decoding's pace.", "",
               "| concurrency | " + " | ".join(names) + " |", "| ---: |" + " ---: |" * len(names)]
        for c, modes in sorted(policy_levels.items()):
            plain = modes.get(NO_SPECULATION)
            cells = [(f"{modes[n]:.1f}" + (f" ({modes[n] / plain:.2f}x)" if plain and n != NO_SPECULATION else ""))
                     if n in modes else "-" for n in names]
            md.append(f"| {c} | " + " | ".join(cells) + " |")
    policy_64 = policy_levels.get(64, {})
    policy_vs_plain = (policy_64["P-EAGLE K=7"] / policy_64[NO_SPECULATION]
                       if "P-EAGLE K=7" in policy_64 and policy_64.get(NO_SPECULATION) else None)

    targets = [
        (f"no speculation at concurrency 1 at least {HBM_SHARE_TARGET:.0%} of the HBM bound",
         hbm_share, HBM_SHARE_TARGET, "{:.0%}"),
        (f"P-EAGLE K=7 at least {PEAGLE_OVER_EAGLE3_TARGET}x EAGLE-3 K=3 at concurrency 1, projected",
         peagle_over_eagle3(1), PEAGLE_OVER_EAGLE3_TARGET, "{:.2f}x"),
        ("P-EAGLE K=7 not slower than no speculation at concurrency 64, projected",
         levels.get(64, {}).get("P-EAGLE K=7", {}).get("projected_vs_plain"), 1.0, "{:.2f}x"),
        ("P-EAGLE K=7 not slower than no speculation at concurrency 64, k left to the speculation policy, "
         "measured", policy_vs_plain, 1.0, "{:.2f}x"),
    ]
    md += ["", "Targets (H100):", ""]
    for text, value, threshold, fmt in targets:
        verdict = "not measured" if value is None else fmt.format(value) + (", met" if value >= threshold else ", not met")
        md.append(f"- {text}: {verdict}")
    data = {"bound": bound, "levels": levels, "policy_levels": policy_levels, "hbm_share_at_concurrency_1": hbm_share,
            "peagle_over_eagle3_at_the_bound": at_bound,
            "targets": [{"target": text, "value": value, "threshold": threshold,
                         "met": None if value is None else value >= threshold}
                        for text, value, threshold, _ in targets]}
    return data, md


# Kernel profiles by gpu_check.sh's kernel_profile: the run's name and what it profiled.
KERNEL_PROFILES = {
    "llama-8b-decode": "Llama-8B-shaped target, no speculation",
    "gpt-oss-decode": "gpt-oss-20b-shaped target, no speculation",
    "gpt-oss-peagle": "gpt-oss-20b-shaped target, P-EAGLE K=7 (random drafter)",
    "gpt-oss-prefill": "gpt-oss-20b-shaped target, a 512-word prompt's prefill",
    "demo-decode-graphs": "demo model by CUDA graphs, no speculation",
    "demo-peagle-graphs": "demo model by CUDA graphs, P-EAGLE K=7",
}
PROFILE_TOP = 15  # kernels listed by name; the rest are summed in one line


def ncu_kernel_times(path):
    """{kernel name: [launches, total ns]} from an ncu --csv --print-units base log of the
    gpu__time_duration.sum metric; ncu's own lines (==PROF==) are skipped."""
    rows = csv.reader(line for line in open(path) if line.startswith('"'))
    header = next(rows, None)
    if not header or "Kernel Name" not in header or "Metric Value" not in header:
        return {}
    name, metric, value = (header.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value"))
    times = {}
    for row in rows:
        if len(row) == len(header) and row[metric] == "gpu__time_duration.sum":
            entry = times.setdefault(row[name], [0, 0.0])
            entry[0] += 1
            entry[1] += float(row[value].replace(",", ""))
    return times


def kernel_profiles(out):
    """Each kernel profile's GPU time by kernel, a mean per engine step: report.json's part and
    report.md's lines."""
    data, md = {}, []
    for name, title in KERNEL_PROFILES.items():
        path, meta = os.path.join(out, f"{name}-kernels.csv"), load(os.path.join(out, f"{name}-kernels.json"))
        times = ncu_kernel_times(path) if meta and os.path.exists(path) else {}
        if not times:
            continue
        steps = meta["steps"]
        ranked = sorted(times.items(), key=lambda kv: -kv[1][1])
        total = sum(ns for _, ns in times.values())
        data[name] = {"steps": steps, "kernels": {k: {"launches": n, "ns": ns} for k, (n, ns) in ranked}}
        md += ["", f"## GPU time by kernel: {title}", "",
               f"ncu, each kernel alone with cold caches, over {steps} engine step(s) of one prompt (its "
               f"prefill first); means per step. All kernels: {sum(n for n, _ in times.values()) / steps:.0f} "
               f"launches, {total / steps / 1e3:.1f} us.", "",
               "| kernel | launches a step | us a step | share |", "| --- | ---: | ---: | ---: |"]
        for kernel, (n, ns) in ranked[:PROFILE_TOP]:
            md.append(f"| `{kernel[:80]}` | {n / steps:.1f} | {ns / steps / 1e3:.1f} | {100 * ns / total:.1f}% |")
        rest = ranked[PROFILE_TOP:]
        if rest:
            n, ns = sum(r[1][0] for r in rest), sum(r[1][1] for r in rest)
            md.append(f"| {len(rest)} others | {n / steps:.1f} | {ns / steps / 1e3:.1f} | {100 * ns / total:.1f}% |")
    return data, md


def graph_memory(sweep_dir, mode):
    """The bytes a sweep's server of `mode` (a sweep row's) said its CUDA graphs hold, from its
    first run's log; None where it said nothing."""
    slug = "none" if mode["method"] == "none" else f"{mode['method']}-k{mode['k']}"
    path = os.path.join(sweep_dir, "runs", f"{slug}-r1", "server.log")
    if not os.path.exists(path):
        return None
    held = [line.split(" bytes=")[1].split()[0] for line in open(path, errors="replace")
            if "captured CUDA graphs" in line and " bytes=" in line]
    return int(held[-1]) if held else None


def graph_gains(out):
    """Each mode without CUDA graphs and with them (`--cuda-graphs`), from sweeps run both ways:
    the demo model at every concurrency, gpt-oss at 1, with the memory its graphs hold.
    report.json's part (None when no pair finished) and report.md's lines."""
    pairs = [("demo model", "demo-sweep", "demo-sweep-graphs", None),
             ("gpt-oss-20b-shaped", "gpt-oss-sweep-c1", "gpt-oss-sweep-c1-graphs", 1)]
    data = []
    for model, without, with_graphs, only in pairs:
        eager, graphed = ((load(os.path.join(out, d, "sweep.json")) or {"rows": []})["rows"] for d in (without, with_graphs))
        graphed = {(r["concurrency"], r["mode"]["name"]): r for r in graphed if r["output_throughput"]}
        for r in eager:
            g = graphed.get((r["concurrency"], r["mode"]["name"]))
            if not g or not r["output_throughput"] or only not in (None, r["concurrency"]):
                continue
            data.append({"model": model, "concurrency": r["concurrency"], "mode": r["mode"]["name"],
                         "tokens_per_s": r["mean_output_throughput"], "tokens_per_s_graphs": g["mean_output_throughput"],
                         "step_ms": step_ms(r), "step_ms_graphs": step_ms(g),
                         "graph_bytes": graph_memory(os.path.join(out, with_graphs), g["mode"])})
    if not data:
        return None, []
    md = ["", "## CUDA graphs", "",
          "Output tokens/s and engine time per step without CUDA graphs and with them (`--cuda-graphs`), "
          "from sweeps run both ways in this run; graphs GB: the device memory the server's graphs took at "
          "start-up, by its log.", "",
          "| model | concurrency | mode | tokens/s | with graphs | step ms | with graphs | graphs GB |",
          "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for d in data:
        ratio = d["tokens_per_s_graphs"] / d["tokens_per_s"] if d["tokens_per_s"] else None
        ms = lambda v: f"{v:.3f}" if v else "-"
        held = f"{d['graph_bytes'] / 1e9:.2f}" if d["graph_bytes"] is not None else "-"
        md.append(f"| {d['model']} | {d['concurrency']} | {d['mode']} | {d['tokens_per_s']:.1f} | "
                  f"{d['tokens_per_s_graphs']:.1f}{f' ({ratio:.2f}x)' if ratio else ''} | "
                  f"{ms(d['step_ms'])} | {ms(d['step_ms_graphs'])} | {held} |")
    return data, md


if __name__ == "__main__":
    main(sys.argv[1])

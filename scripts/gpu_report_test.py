"""gpu_report.py over a made-up results directory: the 8B decode is held to its whole engine
step, and an Nsight Compute log becomes a table of kernels by time a step. Run by
scripts/test.sh; needs no GPU."""

import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
NCU_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
              '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def ncu_row(i, kernel, ns):
    return (f'"{i}","7","peagle-generate","host","{kernel}","1","13","(256, 1, 1)","(1, 512, 1)","0","9.0",'
            f'"Command line profiler metrics","gpu__time_duration.sum","ns","{ns}"')


def sweep_row(concurrency, method, k, name, step_ms):
    """A peagle-bench sweep row whose engine steps take step_ms, all of it in the target."""
    return {"concurrency": concurrency, "mode": {"name": name, "method": method, "k": k},
            "output_throughput": 1e3 / step_ms, "mean_output_throughput": 1e3 / step_ms,
            "engine": {"steps": 100, "target_ms": step_ms, "drafter_ms": 0.0, "verify_ms": 0.0, "other_ms": 0.0}}


def write(out, name, text):
    with open(os.path.join(out, name), "w") as f:
        f.write(text)


def main():
    with tempfile.TemporaryDirectory() as out:
        write(out, "steps.log", "== GPU tests (1 s in)\n")
        write(out, "llama-8b-bound.json", json.dumps(
            {"weight_bytes": 15e9, "copy_bytes_per_second": 4e12, "bound_seconds": 0.00375}))
        # 10 steps: 3 ms of target forward and 4.5 ms in all a step; by graphs 3.75 ms a step.
        times = {"steps": 10, "target_seconds": 0.03, "drafter_seconds": 0.0, "verify_seconds": 0.012,
                 "other_seconds": 0.003}
        write(out, "llama-8b-decode.json", json.dumps({"tokens_per_second": 222.0, "step_times": times}))
        graphs = dict(times, target_seconds=0.0225)
        write(out, "llama-8b-decode-graphs.json", json.dumps({"tokens_per_second": 266.0, "step_times": graphs}))
        fma = dict(times, verify_seconds=0.0045)
        write(out, "llama-8b-decode-fma.json", json.dumps({"tokens_per_second": 250.0, "step_times": fma}))
        # An older run's line without the tensor cores' two forms, then one with them.
        gemm = {"m": 1, "n": 8, "k": 32, "fma_ms": 0.074, "mma_ms": 0.037, "cublas_ms": 0.034, "fma_ratio": 2.176,
                "mma_ratio": 1.088, "fma_weight_gb_per_s": 1595.0, "mma_weight_gb_per_s": 3190.0}
        write(out, "gemm-vs-cublas.jsonl", json.dumps(gemm) + "\n" + json.dumps(
            dict(gemm, m=16, mma_narrow_ms=0.041, mma_wide_ms=0.052, mma_staged_ms=0.06, swiglu_fused_ms=0.04,
                 swiglu_apart_ms=0.045, fp8_fma_ms=0.05, fp8_mma_ms=0.025)) + "\n")
        # The MXFP4 experts' line, the dense experts' (marked), then a line cut short.
        write(out, "moe-experts.jsonl", json.dumps(
            {"rows": 512, "pairs": 2048, "experts_touched": 32, "narrow_ms": 2.0, "wide_ms": 0.8, "fma_ms": 9.5,
             "wide_over_narrow": 0.4, "narrow_weight_gb_per_s": 2124.0, "wide_weight_gb_per_s": 5310.0}) + "\n"
            + json.dumps({"dense": True, "weights": "fp8", "rows": 8, "pairs": 64, "experts_touched": 50, "narrow_ms": 0.1,
                          "wide_ms": 0.2, "wide_over_narrow": 2.0, "narrow_weight_gb_per_s": 4718.6,
                          "wide_weight_gb_per_s": 2359.3}) + "\n"
            + '{"rows": 2048, "pairs": 8192, "exp')
        # An older run's line without heads grouped, then one with them.
        attention = {"model": "gpt-oss-20b", "sequences": 1, "rows_each": 1, "context": 8192, "window": None,
                     "ms": 0.02, "one_block_ms": 0.05, "kv_mb": 33.55, "kv_gb_per_s": 1678.0,
                     "walked_gb_per_s": 13422.0}
        write(out, "paged-attention.jsonl", json.dumps(attention) + "\n" + json.dumps(
            dict(attention, rows_each=2048, window=128, kv_mb=0.52, head_groups_ms=0.04)) + "\n")
        write(out, "llama-8b-decode-kernels.csv", "\n".join([
            "==PROF== Connected to process 7 (peagle-generate)", NCU_HEADER,
            ncu_row(0, "linear_bf16_bf16_row", "1,000"), ncu_row(1, "rms_norm_bf16_bf16", "250"),
            ncu_row(2, "linear_bf16_bf16_row", "3000"), "==PROF== Disconnected from process 7", ""]))
        write(out, "llama-8b-decode-kernels.json", json.dumps({"steps": 2}))
        # gpt-oss at concurrency 1 on the tensor cores (the level of 8 only warms the servers) and
        # on the CUDA cores: a plain step of 2 ms against a bound of 1 ms a token, then 1.25 ms.
        write(out, "gpt-oss-bound.json", json.dumps(
            {"bytes_per_token": 3.7e9, "copy_bytes_per_second": 3.7e12, "bound_seconds_per_token": 0.001,
             "device": "cuda", "window_bytes": {"1": 3.7e9, "4": 6.4e9, "8": 8.8e9}}))
        for name, plain_ms in (("gpt-oss-sweep-c1", 2.0), ("gpt-oss-sweep-c1-fma", 1.25)):
            os.makedirs(os.path.join(out, name))
            write(os.path.join(out, name), "sweep.json", json.dumps({"rows": [
                sweep_row(8, "none", 0, "no speculation", 9.0),
                sweep_row(1, "none", 0, "no speculation", plain_ms),
                sweep_row(1, "eagle3", 3, "EAGLE-3 K=3", 2.65 * plain_ms / 2),
                sweep_row(1, "peagle", 7, "P-EAGLE K=7", 3.94 * plain_ms / 3)]}))
        # gpt-oss at concurrency 1 by CUDA graphs: plain at 1.6 ms a step, its server's graphs
        # holding 0.25 GB by its log.
        os.makedirs(os.path.join(out, "gpt-oss-sweep-c1-graphs", "runs", "none-r1"))
        write(os.path.join(out, "gpt-oss-sweep-c1-graphs"), "sweep.json", json.dumps({"rows": [
            sweep_row(1, "none", 0, "no speculation", 1.6)]}))
        write(os.path.join(out, "gpt-oss-sweep-c1-graphs", "runs", "none-r1"), "server.log",
              "2026-11-30T14:54:24.874922Z  INFO peagle_engine::builder: captured CUDA graphs captured=7 "
              "seconds=0.02 bytes=250000000\n")
        # k left to the speculation policy at concurrency 64: P-EAGLE at 0.98x plain.
        os.makedirs(os.path.join(out, "gpt-oss-sweep-policy"))
        write(os.path.join(out, "gpt-oss-sweep-policy"), "sweep.json", json.dumps({"rows": [
            sweep_row(64, "none", 0, "no speculation", 2.0), sweep_row(64, "peagle", 7, "P-EAGLE K=7", 2.0 / 0.98)]}))
        subprocess.run([sys.executable, os.path.join(HERE, "gpu_report.py"), out], check=True,
                       stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "report.json")) as f:
            report = json.load(f)
        with open(os.path.join(out, "report.md")) as f:
            md = f.read()

    llama = report["llama_8b"]
    assert abs(llama["step_seconds"] - 0.0045) < 1e-12, llama["step_seconds"]
    assert abs(llama["ratio_to_bound"] - 1.2) < 1e-9, llama["ratio_to_bound"]
    assert abs(llama["graphs"]["ratio_to_bound"] - 1.0) < 1e-9, llama["graphs"]
    assert "- without CUDA graphs: an engine step 4.50 ms (1.20x the bound), of which the target's forward " \
           "3.00 ms; 222.0 tokens/s end to end" in md, md
    assert "| 8B-shaped decode step at most 1.25x the HBM bound (lower is better) | 1.20x, met | 1.00x, met |" in md

    assert abs(llama["fma"]["ratio_to_bound"] - 1.0) < 1e-9, llama["fma"]
    assert "- by the CUDA-core matmul (PEAGLE_CUDA_MATMUL=fma), without CUDA graphs: an engine step 3.75 ms " \
           "(1.00x the bound)" in md, md
    assert "| 1 | 0.074 | 0.037 | - | - | - | 0.034 | 2.18x | 1.09x | 1595 | 3190 | - | - | - | - |" in md, md
    assert "| 16 | 0.074 | 0.037 | 0.041 | 0.052 | 0.060 | 0.034 | 2.18x | 1.09x | 1595 | 3190 | 0.040 | 0.045 | " \
           "0.050 | 0.025 |" in md, md
    # The experts' second line was cut short by a time limit: left out.
    assert [r["rows"] for r in report["moe_experts"]] == [512], report["moe_experts"]
    assert "| 512 | 32 | 2.000 | 0.800 | 9.500 | 0.40x | 2124 | 5310 |" in md, md
    assert [r["rows"] for r in report["dense_experts"]] == [8], report["dense_experts"]
    assert "| fp8 | 8 | 50 | 0.100 | 0.200 | 2.00x | 4719 | 2359 |" in md, md

    assert [r["rows_each"] for r in report["paged_attention"]] == [1, 2048], report["paged_attention"]
    assert "| gpt-oss-20b | 1 | 1 | 8192 | - | 0.020 | 0.050 (2.50x) | - | 33.5 | 1678 | 13422 |" in md, md
    assert "| gpt-oss-20b | 1 | 2048 | 8192 | 128 | 0.020 | 0.050 (2.50x) | 0.040 (2.00x) | 0.5 | 1678 | 13422 |" \
        in md, md

    # gpt-oss: the bound's share and the projection (EAGLE-3 at 2.65 tokens a step of 2.65 ms: 1000
    # tokens/s; P-EAGLE 3.94 a step of 2.63 ms: 1500), on each matmul in its own section.
    for key, share in (("gpt_oss", 0.5), ("gpt_oss_fma", 0.8)):
        gpt = report[key]
        assert abs(gpt["hbm_share_at_concurrency_1"] - share) < 1e-9, (key, gpt["hbm_share_at_concurrency_1"])
        peagle_over_eagle3 = gpt["targets"][1]["value"]
        assert abs(peagle_over_eagle3 - 1.5) < 1e-9, (key, peagle_over_eagle3)
        assert 8 not in gpt["levels"] and "8" not in gpt["levels"], "the warm-up level is left out"
    assert "## gpt-oss-20b-shaped random MXFP4 target\n" in md, md
    # (3.94 / 8.8) / (2.65 / 6.4) = 1.0813
    assert abs(report["gpt_oss"]["peagle_over_eagle3_at_the_bound"] - 3.94 * 6.4 / (8.8 * 2.65)) < 1e-9
    assert "P-EAGLE K=7 over EAGLE-3 K=3 projected 1.08x (a window of 8 rows reads 8.80 GB, one of 4 6.40 GB" in md, md
    assert "## gpt-oss-20b-shaped random MXFP4 target on the CUDA cores (PEAGLE_CUDA_MATMUL=fma)" in md, md
    policy = report["gpt_oss"]["targets"][3]
    assert abs(policy["value"] - 0.98) < 1e-9 and policy["met"] is False, policy
    assert "| 64 | 500.0 | - | 490.0 (0.98x) |" in md, md
    assert "k left to the speculation policy, measured: 0.98x, not met" in md, md

    assert "| gpt-oss-20b-shaped | 1 | no speculation | 500.0 | 625.0 (1.25x) | 2.000 | 1.600 | 0.25 |" in md, md

    kernels = report["kernel_profiles"]["llama-8b-decode"]["kernels"]
    assert list(kernels) == ["linear_bf16_bf16_row", "rms_norm_bf16_bf16"], kernels
    assert kernels["linear_bf16_bf16_row"] == {"launches": 2, "ns": 4000.0}, kernels
    assert "All kernels: 2 launches, 2.1 us." in md, md
    assert "| `linear_bf16_bf16_row` | 1.0 | 2.0 | 94.1% |" in md, md
    print("gpu_report_test.py: ok")


if __name__ == "__main__":
    main()

"""A random gpt-oss-20b-shaped checkpoint with MXFP4 experts, for the CPU bench of issue 30
(13 GB; never committed). Experts are random bytes in the published MXFP4 layout with scales
near 2^-6; every other weight is bf16 N(0, 0.02). Also writes bound.json: the bytes one decode
token reads (4 active experts a layer in MXFP4, attention, router, norms, lm_head and one
embedding row) and this machine's memory copy bandwidth, measured with numpy.

    python3 scripts/make_random_gpt_oss.py --out /tmp/gpt-oss-20b-random
"""

import argparse
import json
import os
import time

import numpy as np
import torch
from safetensors.torch import save_file

from make_random_llama import write_word_tokenizer

SHAPE = dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
             num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
             num_experts_per_tok=4, sliding_window=128)


def copy_bandwidth():
    """Bytes per second moved by copies of 1 GiB in host memory (each byte read and written)."""
    src = np.ones(1 << 30, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    reps = 5
    start = time.perf_counter()
    for _ in range(reps):
        np.copyto(dst, src)
    return 2 * src.nbytes * reps / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    s = SHAPE
    h, i, e, v, d = s["hidden_size"], s["intermediate_size"], s["num_local_experts"], s["vocab_size"], s["head_dim"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    gen = torch.Generator().manual_seed(0)

    def bf16(*dims):
        return (torch.randn(dims, generator=gen) * 0.02).to(torch.bfloat16)

    def mxfp4(out, inner):
        blocks = torch.randint(0, 256, (e, out, inner // 32, 16), dtype=torch.uint8, generator=gen)
        scales = torch.randint(120, 123, (e, out, inner // 32), dtype=torch.uint8, generator=gen)
        return blocks, scales

    per_token = 0
    for layer in range(s["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        t = {f"{p}.input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
             f"{p}.post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
             f"{p}.self_attn.q_proj.weight": bf16(q, h), f"{p}.self_attn.q_proj.bias": bf16(q),
             f"{p}.self_attn.k_proj.weight": bf16(kv, h), f"{p}.self_attn.k_proj.bias": bf16(kv),
             f"{p}.self_attn.v_proj.weight": bf16(kv, h), f"{p}.self_attn.v_proj.bias": bf16(kv),
             f"{p}.self_attn.o_proj.weight": bf16(h, q), f"{p}.self_attn.o_proj.bias": bf16(h),
             f"{p}.self_attn.sinks": bf16(s["num_attention_heads"]),
             f"{p}.mlp.router.weight": bf16(e, h), f"{p}.mlp.router.bias": bf16(e),
             f"{p}.mlp.experts.gate_up_proj_bias": bf16(e, 2 * i), f"{p}.mlp.experts.down_proj_bias": bf16(e, h)}
        gu, down = mxfp4(2 * i, h), mxfp4(h, i)
        t[f"{p}.mlp.experts.gate_up_proj_blocks"], t[f"{p}.mlp.experts.gate_up_proj_scales"] = gu
        t[f"{p}.mlp.experts.down_proj_blocks"], t[f"{p}.mlp.experts.down_proj_scales"] = down
        dense = sum(x.numel() * x.element_size() for n, x in t.items() if "experts" not in n)
        experts = sum(x.numel() * x.element_size() for n, x in t.items() if "experts" in n)
        per_token += dense + experts * s["num_experts_per_tok"] // e
        save_file(t, os.path.join(args.out, f"model-{layer:05d}.safetensors"), metadata={"format": "pt"})
    rest = {"model.embed_tokens.weight": bf16(v, h), "lm_head.weight": bf16(v, h),
            "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    per_token += 2 * v * h + 2 * h + 2 * h  # lm_head, final norm, one embedding row
    save_file(rest, os.path.join(args.out, "model-rest.safetensors"), metadata={"format": "pt"})
    files = sorted(f for f in os.listdir(args.out) if f.endswith(".safetensors"))
    weight_map = {}
    for f in files:
        from safetensors import safe_open
        with safe_open(os.path.join(args.out, f), "pt") as st:
            weight_map.update({k: f for k in st.keys()})
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    config = dict(s, architectures=["GptOssForCausalLM"], model_type="gpt_oss", dtype="bfloat16",
                  rms_norm_eps=1e-5, rope_theta=150000.0, max_position_embeddings=131072,
                  rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                "truncate": False, "original_max_position_embeddings": 4096},
                  quantization_config={"quant_method": "mxfp4"}, tie_word_embeddings=False,
                  attention_bias=True, bos_token_id=0, eos_token_id=1,
                  layer_types=["sliding_attention", "full_attention"] * (s["num_hidden_layers"] // 2))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    write_word_tokenizer(args.out, v)
    bound = {"bytes_per_token": per_token, "copy_bytes_per_second": copy_bandwidth()}
    bound["bound_seconds_per_token"] = per_token / bound["copy_bytes_per_second"]
    with open(os.path.join(args.out, "bound.json"), "w") as f:
        json.dump(bound, f, indent=1)
    print(json.dumps(bound))


if __name__ == "__main__":
    main()

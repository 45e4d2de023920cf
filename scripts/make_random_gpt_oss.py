"""A random gpt-oss-20b-shaped checkpoint with MXFP4 experts, for the CPU bench of issue 30 and,
with --gpu, the GPU bench of scripts/gpu_check.sh (13 GB; never committed). Experts are random
bytes in the published MXFP4 layout with scales near 2^-6; every other weight is bf16
N(0, 0.02); the tokenizer is a word-level one with one word per id ("t0", "t1", ...). Also
writes:

- bound.json: the bytes one decode token reads (4 active experts a layer in MXFP4, attention,
  router, norms, lm_head and one embedding row) and the copy bandwidth of the memory the
  weights are read from: the host's, measured with numpy, or with --gpu the GPU's, measured
  with torch. --gpu also draws the random tensors on the GPU, which is much faster. Also the
  bytes a step over a window of 1, 4 (EAGLE-3 K=3's verification) and 8 rows (P-EAGLE K=7's)
  reads, `window_bytes`: a window reads each expert any of its rows routes to, as many as
  E (1 - (1 - k/E)^rows) of a layer's E when rows route independently and uniformly, as a
  random router's nearly do.
- prompts.jsonl: 64 prompts of 32 to 128 random words, for peagle-bench.

    python3 scripts/make_random_gpt_oss.py --out /tmp/gpt-oss-20b-random [--gpu]

--tiny makes the same model at 2 layers, width 64, 4 experts and 512 words, to try the scripts
that use it on any machine.
"""

import argparse
import json
import os
import random
import time

import numpy as np
import torch
from safetensors.torch import save_file

from make_random_llama import copy_bandwidth as gpu_copy_bandwidth
from make_random_llama import write_word_tokenizer

SHAPE = dict(vocab_size=201088, hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
             num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
             num_experts_per_tok=4, sliding_window=128)
# Its heads are wider in all than the model, as gpt-oss-20b's are (64 x 64 against 2880).
TINY = dict(SHAPE, vocab_size=512, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=4,
            num_experts_per_tok=2, sliding_window=8)


def host_copy_bandwidth():
    """Bytes per second moved by copies of 1 GiB in host memory (each byte read and written)."""
    src = np.ones(1 << 30, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    reps = 5
    start = time.perf_counter()
    for _ in range(reps):
        np.copyto(dst, src)
    return 2 * src.nbytes * reps / (time.perf_counter() - start)


def normal(gen, *dims):
    """bf16 N(0, 0.02), drawn on the generator's device and returned on the host for writing."""
    return torch.empty(dims, dtype=torch.bfloat16, device=gen.device).normal_(0, 0.02, generator=gen).cpu()


def write_word_prompts(out, vocab_size, n=64, seed=0):
    """n prompts of 32 to 128 random words of the word tokenizer, as peagle-bench reads them;
    ids 0 and 1 (BOS and EOS) left out."""
    rng = random.Random(seed)
    with open(os.path.join(out, "prompts.jsonl"), "w") as f:
        for _ in range(n):
            words = [f"t{rng.randrange(2, vocab_size)}" for _ in range(rng.randint(32, 128))]
            f.write(json.dumps({"prompt": " ".join(words)}) + "\n")


def expected_experts(rows, shape):
    """The experts of a layer a window of `rows` rows reads, expected when each row routes to
    its top k of E independently and uniformly: E (1 - (1 - k/E)^rows)."""
    e, k = shape["num_local_experts"], shape["num_experts_per_tok"]
    return e * (1 - (1 - k / e) ** rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", action="store_true", help="draw the weights on the GPU and bound by its bandwidth")
    ap.add_argument("--tiny", action="store_true", help="2 layers, width 64, 4 experts, 512 words")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    s = TINY if args.tiny else SHAPE
    h, i, e, v, d = s["hidden_size"], s["intermediate_size"], s["num_local_experts"], s["vocab_size"], s["head_dim"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    device = "cuda" if args.gpu else "cpu"
    gen = torch.Generator(device=device).manual_seed(0)

    def bf16(*dims):
        return normal(gen, *dims)

    def mxfp4(out, inner):
        blocks = torch.randint(0, 256, (e, out, inner // 32, 16), dtype=torch.uint8, generator=gen, device=device)
        scales = torch.randint(120, 123, (e, out, inner // 32), dtype=torch.uint8, generator=gen, device=device)
        return blocks.cpu(), scales.cpu()

    weight_map = {}

    def save(tensors, name):
        save_file(tensors, os.path.join(args.out, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})

    per_token = dense_bytes = expert_bytes = 0
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
        dense_bytes += dense
        expert_bytes += experts
        save(t, f"model-{layer:05d}.safetensors")
    rest = {"model.embed_tokens.weight": bf16(v, h), "lm_head.weight": bf16(v, h),
            "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    per_token += 2 * v * h + 2 * h + 2 * h  # lm_head, final norm, one embedding row
    dense_bytes += 2 * v * h + 2 * h + 2 * h
    save(rest, "model-rest.safetensors")
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
    write_word_prompts(args.out, v)
    bandwidth = gpu_copy_bandwidth() if args.gpu else host_copy_bandwidth()
    bound = {"device": device, "bytes_per_token": per_token, "copy_bytes_per_second": bandwidth,
             "bound_seconds_per_token": per_token / bandwidth,
             "window_bytes": {str(rows): dense_bytes + expert_bytes * expected_experts(rows, s) / e
                              for rows in (1, 4, 8)}}
    with open(os.path.join(args.out, "bound.json"), "w") as f:
        json.dump(bound, f, indent=1)
    print(json.dumps(bound))


if __name__ == "__main__":
    main()

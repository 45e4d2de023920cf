"""A random-weight bf16 Llama checkpoint of a given shape, for GPU benches (made on the GPU
host: 16 GB for the 8B shape). Weights are N(0, 0.02); the tokenizer is a word-level one with
one word per id ("t0", "t1", ...), so any id decodes. Also measures the GPU's copy bandwidth
with the same torch, for the bench's HBM bound, and writes it with the checkpoint's weight
bytes to bound.json.

    python3 scripts/make_random_llama.py --out /tmp/llama-8b
"""

import argparse
import json
import os
import time

import torch
from safetensors.torch import save_file

LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256)


def write_word_tokenizer(out, vocab_size):
    """A word-level tokenizer.json with one word per id ("t0", "t1", ...), so any id decodes."""
    tokenizer = {"version": "1.0", "added_tokens": [], "normalizer": None,
                 "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
                 "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
                 "model": {"type": "WordLevel", "vocab": {f"t{n}": n for n in range(vocab_size)}, "unk_token": "t0"}}
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f)


def copy_bandwidth():
    """Bytes moved per second by device-to-device copies of 2 GiB (each byte read and written)."""
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    reps = 20
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * src.numel() * src.element_size() * reps / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=LLAMA_8B["num_hidden_layers"])
    args = ap.parse_args()
    shape = dict(LLAMA_8B, num_hidden_layers=args.layers)
    os.makedirs(args.out, exist_ok=True)
    h, i, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    d = h // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * d
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*dims):
        return torch.empty(dims, dtype=torch.bfloat16, device="cuda").normal_(0, 0.02, generator=gen).cpu()

    tensors = {"model.embed_tokens.weight": rand(v, h), "lm_head.weight": rand(v, h),
               "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for layer in range(shape["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        tensors.update({
            f"{p}.self_attn.q_proj.weight": rand(h, h), f"{p}.self_attn.k_proj.weight": rand(kv, h),
            f"{p}.self_attn.v_proj.weight": rand(kv, h), f"{p}.self_attn.o_proj.weight": rand(h, h),
            f"{p}.mlp.gate_proj.weight": rand(i, h), f"{p}.mlp.up_proj.weight": rand(i, h),
            f"{p}.mlp.down_proj.weight": rand(h, i),
            f"{p}.input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            f"{p}.post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        })
    save_file(tensors, os.path.join(args.out, "model.safetensors"))
    config = dict(shape, architectures=["LlamaForCausalLM"], model_type="llama", dtype="bfloat16",
                  head_dim=d, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=8192,
                  tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    write_word_tokenizer(args.out, v)
    # Bytes one decode step reads: every weight but the embedding table, of which one row.
    weight_bytes = sum(t.numel() * t.element_size() for n, t in tensors.items() if n != "model.embed_tokens.weight")
    weight_bytes += h * 2
    bound = {"weight_bytes": weight_bytes, "copy_bytes_per_second": copy_bandwidth()}
    bound["bound_seconds"] = weight_bytes / bound["copy_bytes_per_second"]
    with open(os.path.join(args.out, "bound.json"), "w") as f:
        json.dump(bound, f, indent=1)
    print(json.dumps(bound))


if __name__ == "__main__":
    main()

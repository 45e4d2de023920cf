"""Two random drafters for a target made by scripts/make_random_gpt_oss.py, in the layouts of the
heads published for gpt-oss-20b, for the GPU bench of scripts/gpu_check.sh (never committed):

  OUT/peagle/  P-EAGLE in the AWS layout of amazon/GPT-OSS-20B-P-EAGLE (3.8 GB at full shape):
               4 layers (`midlayer.*`, then `layers.{1,2,3}.*`), its own embedding, an lm_head
               over the whole vocabulary (no d2t/t2d), mask_hidden [1, 1, 3 x hidden] and
               ptd_token_id 201020 (the last id of a smaller vocabulary).
  OUT/eagle3/  EAGLE-3 in the speculators format (what vLLM reads and peagle-train writes):
               1 layer under `layers.0.*`, its own embedding, a 32,000-token draft vocabulary
               mapped by d2t/t2d (--draft-vocab).

Their layers have the shape of gpt-oss's published EAGLE-3 heads: the target's width and
heads, intermediate 6 x width (17,280), llama3 RoPE. Neither names its aux layers, so the
loader takes vLLM's default, as for the published P-EAGLE head. Weights are bf16 N(0, 0.02),
norms 1: acceptance means nothing with them, the bench measures step times.

    python3 scripts/make_random_drafters.py --target /tmp/gpt-oss-20b-random --out /tmp/gpt-oss-drafters [--gpu]
"""

import argparse
import json
import os

import torch
from safetensors.torch import save_file

from make_random_gpt_oss import normal

# amazon/GPT-OSS-20B-P-EAGLE's ptd_token_id, a reserved id of gpt-oss's vocabulary.
MASK_TOKEN = 201020
# Target layers whose states the drafters read (vLLM's default picks three).
N_AUX = 3


def layer_config(target, num_layers):
    """The drafter layers' Llama config, at the target's width, heads and vocabulary."""
    h = target["hidden_size"]
    return {"model_type": "llama", "vocab_size": target["vocab_size"], "hidden_size": h,
            "intermediate_size": 6 * h, "num_hidden_layers": num_layers,
            "num_attention_heads": target["num_attention_heads"],
            "num_key_value_heads": target["num_key_value_heads"], "head_dim": target["head_dim"],
            "rms_norm_eps": 1e-5, "max_position_embeddings": target["max_position_embeddings"],
            "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            "tie_word_embeddings": False, "dtype": "bfloat16"}


def drafter_weights(gen, cfg, draft_vocab, first):
    """Embedding, fc, the layers (the first under `first`: `midlayer` or `layers.0`), norm and
    an lm_head over `draft_vocab` ids."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]

    def ones():
        return torch.ones(h, dtype=torch.bfloat16)

    w = {"embed_tokens.weight": normal(gen, v, h), "fc.weight": normal(gen, h, N_AUX * h),
         f"{first}.hidden_norm.weight": ones(), "norm.weight": ones(), "lm_head.weight": normal(gen, draft_vocab, h)}
    for layer in range(cfg["num_hidden_layers"]):
        p = first if layer == 0 else f"layers.{layer}"
        d_in = 2 * h if layer == 0 else h  # the first layer reads cat([embedding, hidden])
        w.update({f"{p}.input_layernorm.weight": ones(), f"{p}.post_attention_layernorm.weight": ones(),
                  f"{p}.self_attn.q_proj.weight": normal(gen, q, d_in),
                  f"{p}.self_attn.k_proj.weight": normal(gen, kv, d_in),
                  f"{p}.self_attn.v_proj.weight": normal(gen, kv, d_in),
                  f"{p}.self_attn.o_proj.weight": normal(gen, h, q),
                  f"{p}.mlp.gate_proj.weight": normal(gen, i, h), f"{p}.mlp.up_proj.weight": normal(gen, i, h),
                  f"{p}.mlp.down_proj.weight": normal(gen, h, i)})
    return w


def write(out, config, weights):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    save_file(weights, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    print(f"{out}: {sum(t.numel() * t.element_size() for t in weights.values()) / 1e6:.0f} MB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True, help="a directory made by make_random_gpt_oss.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--draft-vocab", type=int, default=32000, help="the EAGLE-3 drafter's vocabulary")
    ap.add_argument("--gpu", action="store_true", help="draw the weights on the GPU")
    args = ap.parse_args()
    with open(os.path.join(args.target, "config.json")) as f:
        target = json.load(f)
    vocab, h = target["vocab_size"], target["hidden_size"]
    if not 0 < args.draft_vocab <= vocab:
        ap.error(f"--draft-vocab must be between 1 and the target's {vocab} words")
    device = "cuda" if args.gpu else "cpu"

    gen = torch.Generator(device=device).manual_seed(1)
    cfg = layer_config(target, 4)
    w = drafter_weights(gen, cfg, vocab, "midlayer")
    w["mask_hidden"] = normal(gen, 1, 1, N_AUX * h)
    config = dict(cfg, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=vocab, target_hidden_size=h,
                  ptd_token_id=min(MASK_TOKEN, vocab - 1))
    write(os.path.join(args.out, "peagle"), config, w)

    gen = torch.Generator(device=device).manual_seed(2)
    cfg = layer_config(target, 1)
    w = drafter_weights(gen, cfg, args.draft_vocab, "layers.0")
    # The draft vocabulary: target ids in increasing order, draft id i being target id i + d2t[i].
    chosen = torch.randperm(vocab, generator=gen, device=device)[:args.draft_vocab].sort().values.cpu()
    w["d2t"] = chosen - torch.arange(args.draft_vocab)
    w["t2d"] = torch.zeros(vocab, dtype=torch.bool)
    w["t2d"][chosen] = True
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
              "speculators_version": "0.4.0", "draft_vocab_size": args.draft_vocab, "norm_before_residual": True,
              "target_hidden_size": h, "transformer_layer_config": cfg,
              "speculators_config": {
                  "algorithm": "eagle3", "default_proposal_method": "greedy",
                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                        "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                  "verifier": {"name_or_path": args.target, "architectures": target["architectures"]}}}
    write(os.path.join(args.out, "eagle3"), config, w)


if __name__ == "__main__":
    main()

"""Generate the tiny gpt-oss golden fixtures under tests/fixtures/:

  tiny-gpt-oss/        GptOssForCausalLM, float32, dense experts, 4 layers
  tiny-gpt-oss-mxfp4/  the same model with its experts in MXFP4 (blocks + scales, as the
                       published gpt-oss checkpoints store them); every other weight dense

Both exercise what gpt-oss has beyond Llama: biases on q/k/v/o, a sink logit per head
(non-zero), alternating sliding-window (8 tokens, shorter than two of the prompts) and full
layers, YaRN RoPE (factor 4, truncate false, as gpt-oss), a router with bias choosing 2 of 4
experts, and the clamped SwiGLU experts with biases (limit 7, weights scaled up so the clamps
bite). reference.safetensors holds transformers' float32 outputs in the layout of
scripts/make_fixtures.py (p{i}.input_ids, logits, hidden_in, prenorm, greedy).

MXFP4 cannot be produced by transformers on a CPU, so this script quantizes: per block of 32
input values, the scale exponent is the smallest that fits the block's largest magnitude under
6 (e2m1's largest value), values round to the nearest e2m1 code, two codes a byte, low nibble
first. The MXFP4 fixture's reference comes from the model with its experts replaced by the
dequantized values, and transformers' own MXFP4 loader, where it runs on the CPU, is checked to
read the written checkpoint to the same logits.

    python3 scripts/make_gpt_oss_fixtures.py
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GptOssConfig, GptOssForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import (  # noqa: E402
    BOS_ID,
    EOS_ID,
    FIXTURES,
    GREEDY_STEPS,
    MIN_TOP2_GAP,
    PROMPT_LENGTHS,
    VOCAB_SIZE,
    forward_with_captures,
    reference_entries,
    greedy,
    random_prompt,
    save_tokenizer,
    train_tokenizer,
)

torch.set_num_threads(1)

PROMPT_SEEDS = [7000, 8000, 9000]
FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def config():
    return GptOssConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
        max_position_embeddings=64,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        initializer_range=0.1,
    )


def build_model(seed):
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config()).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.2 * torch.randn_like(param))
            elif name.endswith("sinks"):
                param.copy_(2.0 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.3 * torch.randn_like(param))
            elif name.endswith("gate_up_proj"):
                param.mul_(4.0)  # gate and up values beyond the clamp at 7 occur
    return model.eval()


def quantize_mxfp4(w):
    """[..., out, in] float to (blocks [..., out, in/32, 16] u8, scales [..., out, in/32] u8)."""
    *lead, out, inner = w.shape
    groups = w.reshape(*lead, out, inner // 32, 32)
    biggest = groups.abs().amax(dim=-1, keepdim=True).clamp(min=2.0**-126)
    exponent = torch.ceil(torch.log2(biggest / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent)
    codes = (scaled[..., None] - FP4_VALUES).abs().argmin(dim=-1).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = (exponent[..., 0] + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def dequantize_mxfp4(blocks, scales):
    lo, hi = FP4_VALUES[(blocks & 0x0F).long()], FP4_VALUES[(blocks >> 4).long()]
    values = torch.stack([lo, hi], dim=-1).reshape(*blocks.shape[:-1], 32)
    values = values * torch.exp2(scales.float() - 127)[..., None]
    return values.reshape(*blocks.shape[:-2], -1)


def save(model, out_dir, tokenizer, mxfp4):
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*.safetensors"):
        stale.unlink()
    model.save_pretrained(out_dir)
    save_tokenizer(tokenizer, out_dir)
    cfg = json.loads((out_dir / "config.json").read_text())
    if mxfp4:
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        for name in [k for k in state if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
            dense = state.pop(name)  # [E, in, out]
            blocks, scales = quantize_mxfp4(dense.transpose(1, 2))
            state[name + "_blocks"], state[name + "_scales"] = blocks, scales
        for stale in out_dir.glob("model*.safetensors*"):
            stale.unlink()
        save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def with_dequantized_experts(model):
    """The model with every expert weight replaced by its MXFP4 round trip."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                blocks, scales = quantize_mxfp4(param.transpose(1, 2))
                param.copy_(dequantize_mxfp4(blocks, scales).transpose(1, 2))
    return model


@torch.no_grad()
def reference(model, out_dir):
    model.config._attn_implementation = "eager"
    tensors = {}
    for i, length in enumerate(PROMPT_LENGTHS):
        seed = PROMPT_SEEDS[i]
        while True:
            ids = random_prompt(seed, length)
            tokens, gap = greedy(model, ids, GREEDY_STEPS)
            if gap >= MIN_TOP2_GAP:
                break
            seed += 1
        if seed != PROMPT_SEEDS[i]:
            print(f"  !! record PROMPT_SEEDS[{i}] = {seed} in this script")
        logits, hidden_in, prenorm = forward_with_captures(model, ids)
        print(f"  p{i}: n={length} seed={seed} min top-2 gap={gap:.4f} logits std={logits.std().item():.3f}")
        tensors.update(reference_entries(i, ids, logits, hidden_in, prenorm, tokens))
    save_file(tensors, str(out_dir / "reference.safetensors"))
    return tensors


def check_reload(out_dir, tensors, what):
    """transformers reads the written checkpoint back to the reference logits."""
    try:
        model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    except Exception as e:  # MXFP4 loading needs kernels some CPU installs lack
        print(f"  ({what}: transformers could not load it on this CPU: {type(e).__name__}: {e})")
        return
    with torch.no_grad():
        for i in range(len(PROMPT_LENGTHS)):
            logits = model(tensors[f"p{i}.input_ids"][None, :]).logits[0].float()
            diff = (logits - tensors[f"p{i}.logits"]).abs().max().item()
            assert diff < 1e-4, f"{what} p{i}: reloaded logits off by {diff}"
    print(f"  {what}: transformers reloads it to the reference logits")


def main():
    tokenizer = train_tokenizer()
    dense_dir = FIXTURES / "tiny-gpt-oss"
    model = build_model(seed=3)
    save(model, dense_dir, tokenizer, mxfp4=False)
    print(f"{dense_dir}:")
    check_reload(dense_dir, reference(model, dense_dir), "dense")

    mxfp4_dir = FIXTURES / "tiny-gpt-oss-mxfp4"
    model = with_dequantized_experts(build_model(seed=3))
    save(model, mxfp4_dir, tokenizer, mxfp4=True)
    print(f"{mxfp4_dir}:")
    check_reload(mxfp4_dir, reference(model, mxfp4_dir), "mxfp4")
    for d in (dense_dir, mxfp4_dir):
        for f in sorted(d.iterdir()):
            print(f"  {f.name}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()

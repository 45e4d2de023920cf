"""Generate random-weight EAGLE-3 / P-EAGLE drafter fixtures under tests/fixtures/.

Three drafter heads for the existing tiny target checkpoints (made by
scripts/make_fixtures.py):

  tests/fixtures/tiny-llama-peagle/      speculators format, P-EAGLE, 2 layers,
                                         draft vocab 256 (d2t/t2d), mask_hidden [1,1,192],
                                         target tests/fixtures/tiny-llama.
  tests/fixtures/tiny-qwen3-eagle3/      original EAGLE-3 (AWS) layout, 1 layer under
                                         `midlayer.*`, no embed_tokens (falls back to the
                                         target's), no d2t/t2d, target tests/fixtures/tiny-qwen3.
  tests/fixtures/tiny-llama-peagle-aws/  AWS layout P-EAGLE, 3 layers (`midlayer.*`,
                                         `layers.1.*`, `layers.2.*`), norm_before_residual,
                                         d2t all zeros, mask_hidden [1,192].
  tests/fixtures/tiny-gpt-oss-peagle/    the layout of amazon/GPT-OSS-20B-P-EAGLE for
                                         tests/fixtures/tiny-gpt-oss(-mxfp4): 4 layers
                                         (`midlayer.*` + 3), full-vocabulary lm_head (no
                                         d2t/t2d), mask_hidden [1,1,192], `ptd_token_id`, no
                                         aux layer ids (vLLM's default applies).

Each directory holds config.json, model.safetensors (float32 weights; matrices
~N(0, 0.1^2), RMSNorm weights 1 + 0.2*randn) and reference.safetensors with the
outputs of the plain-PyTorch drafter forward written below (no HF model classes):

  tokens      int64   [12]              random ids in [2, 383)
  positions   int64   [12]              arange(12)
  aux         float32 [12, 3*Ht]        concatenated captured target hidden states, N(0, 1)
  logits      float32 [12, draft_vocab] causal forward over the 12 rows, nothing cached
  prenorm     float32 [12, H]           last layer output, before the final norm
  mask_logits float32 [12, draft_vocab] (P-EAGLE only) same, with the last 4 rows'
                                        tokens set to the mask token and aux rows to
                                        mask_hidden

Rerun from the repo root:

    python3 scripts/make_drafter_fixtures.py

Everything is seeded, so a rerun reproduces the same files.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

torch.set_num_threads(1)

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"

TARGET_VOCAB = 384
HIDDEN = 64  # drafter hidden == target hidden for both targets
INTERMEDIATE = 128
N_HEADS, N_KV_HEADS, HEAD_DIM = 4, 2, 16
EPS = 1e-5
ROPE_THETA = 10000.0
N_AUX = 3
MASK_TOKEN = 383
# References start at position 0: the runtime caches every earlier position of a sequence.
N_REF, POS_OFFSET, N_MASKED = 12, 0, 4

# Fixtures are committed: keep each directory under the size of the target fixtures.
SIZE_CAP = 1024 * 1024

# The Llama layer shape every drafter here uses; each sets its own num_hidden_layers.
LAYER_CONFIG = {
    "model_type": "llama",
    "vocab_size": TARGET_VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_hidden_layers": 1,
    "num_attention_heads": N_HEADS,
    "num_key_value_heads": N_KV_HEADS,
    "head_dim": HEAD_DIM,
    "rms_norm_eps": EPS,
    "rope_theta": ROPE_THETA,
    "max_position_embeddings": 256,
}

# Plain Llama-style config shared by the two AWS-layout drafters.
AWS_BASE_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"],
    **LAYER_CONFIG,
    "draft_vocab_size": TARGET_VOCAB,
    "target_hidden_size": HIDDEN,
}


# ---------------------------------------------------------------- weights


def make_weights(gen, n_layers, draft_vocab, with_embed):
    """Random drafter weights under canonical names (layers.{i}.*, speculators style)."""

    def mat(*shape):
        return torch.randn(*shape, generator=gen) * 0.1

    def norm_w():
        return 1.0 + 0.2 * torch.randn(HIDDEN, generator=gen)

    w = {}
    if with_embed:
        w["embed_tokens.weight"] = mat(TARGET_VOCAB, HIDDEN)
    w["fc.weight"] = mat(HIDDEN, N_AUX * HIDDEN)
    for i in range(n_layers):
        p = f"layers.{i}."
        d_in = 2 * HIDDEN if i == 0 else HIDDEN  # layer 0 reads cat([embed, hidden])
        w[p + "input_layernorm.weight"] = norm_w()
        if i == 0:
            w[p + "hidden_norm.weight"] = norm_w()
        w[p + "post_attention_layernorm.weight"] = norm_w()
        w[p + "self_attn.q_proj.weight"] = mat(N_HEADS * HEAD_DIM, d_in)
        w[p + "self_attn.k_proj.weight"] = mat(N_KV_HEADS * HEAD_DIM, d_in)
        w[p + "self_attn.v_proj.weight"] = mat(N_KV_HEADS * HEAD_DIM, d_in)
        w[p + "self_attn.o_proj.weight"] = mat(HIDDEN, N_HEADS * HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = mat(INTERMEDIATE, HIDDEN)
        w[p + "mlp.up_proj.weight"] = mat(INTERMEDIATE, HIDDEN)
        w[p + "mlp.down_proj.weight"] = mat(HIDDEN, INTERMEDIATE)
    w["norm.weight"] = norm_w()
    w["lm_head.weight"] = mat(draft_vocab, HIDDEN)
    return w


def to_aws_names(w):
    """AWS / original EAGLE-3 layout: layer 0 lives under `midlayer.*`."""
    return {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v
            for k, v in w.items()}


# ---------------------------------------------------------------- reference forward


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def attention(w, p, x, positions):
    """GQA causal self-attention over the n rows of x, rotate-halves rope."""
    n = x.shape[0]
    q = (x @ w[p + "q_proj.weight"].T).view(n, N_HEADS, HEAD_DIM).transpose(0, 1)
    k = (x @ w[p + "k_proj.weight"].T).view(n, N_KV_HEADS, HEAD_DIM).transpose(0, 1)
    v = (x @ w[p + "v_proj.weight"].T).view(n, N_KV_HEADS, HEAD_DIM).transpose(0, 1)

    inv_freq = 1.0 / ROPE_THETA ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)  # [n, hd]
    cos, sin = emb.cos(), emb.sin()
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin

    group = N_HEADS // N_KV_HEADS
    k = k.repeat_interleave(group, dim=0)  # q head h uses kv head h // group
    v = v.repeat_interleave(group, dim=0)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(HEAD_DIM)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    out = scores.softmax(-1) @ v  # [heads, n, hd]
    out = out.transpose(0, 1).reshape(n, N_HEADS * HEAD_DIM)
    return out @ w[p + "o_proj.weight"].T


def mlp(w, p, x):
    gate = torch.nn.functional.silu(x @ w[p + "gate_proj.weight"].T)
    return (gate * (x @ w[p + "up_proj.weight"].T)) @ w[p + "down_proj.weight"].T


def drafter_forward(w, embed, n_layers, tokens, positions, aux, norm_before_residual):
    """Returns (logits [n, draft_vocab], prenorm [n, H]). `w` uses canonical names."""
    h = aux @ w["fc.weight"].T
    e = embed[tokens]

    # Layer 0: fused input (embedding first).
    p = "layers.0."
    h_normed = rmsnorm(h, w[p + "hidden_norm.weight"])
    x_in = torch.cat([rmsnorm(e, w[p + "input_layernorm.weight"]), h_normed], dim=-1)
    residual = h_normed if norm_before_residual else h
    x = residual + attention(w, p + "self_attn.", x_in, positions)
    x = x + mlp(w, p + "mlp.", rmsnorm(x, w[p + "post_attention_layernorm.weight"]))

    # Layers 1..N-1: standard pre-norm decoder layers.
    for i in range(1, n_layers):
        p = f"layers.{i}."
        x = x + attention(w, p + "self_attn.", rmsnorm(x, w[p + "input_layernorm.weight"]), positions)
        x = x + mlp(w, p + "mlp.", rmsnorm(x, w[p + "post_attention_layernorm.weight"]))

    logits = rmsnorm(x, w["norm.weight"]) @ w["lm_head.weight"].T
    return logits, x


def make_reference(gen, w, embed, n_layers, norm_before_residual, mask_hidden):
    tokens = torch.randint(2, MASK_TOKEN, (N_REF,), generator=gen, dtype=torch.int64)
    positions = torch.arange(N_REF, dtype=torch.int64) + POS_OFFSET
    aux = torch.randn(N_REF, N_AUX * HIDDEN, generator=gen)
    logits, prenorm = drafter_forward(w, embed, n_layers, tokens, positions, aux, norm_before_residual)
    ref = {"tokens": tokens, "positions": positions, "aux": aux, "logits": logits, "prenorm": prenorm}
    if mask_hidden is not None:
        m_tokens, m_aux = tokens.clone(), aux.clone()
        m_tokens[-N_MASKED:] = MASK_TOKEN
        m_aux[-N_MASKED:] = mask_hidden.reshape(N_AUX * HIDDEN)
        ref["mask_logits"], _ = drafter_forward(
            w, embed, n_layers, m_tokens, positions, m_aux, norm_before_residual
        )
    return ref


# ---------------------------------------------------------------- output


def write_dir(name, config, tensors, reference):
    out = FIXTURES / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    save_file({k: v.contiguous() for k, v in reference.items()}, str(out / "reference.safetensors"))

    # Verify by reloading: exact round trip.
    for fname, expected in (("model.safetensors", tensors), ("reference.safetensors", reference)):
        loaded = load_file(str(out / fname))
        assert loaded.keys() == expected.keys(), (name, fname)
        for k, v in expected.items():
            assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), (name, fname, k)
    assert json.loads((out / "config.json").read_text()) == config

    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"\n{out.relative_to(FIXTURES.parent.parent)}  ({total / 1024:.1f} KiB)")
    for f in sorted(out.iterdir()):
        print(f"  {f.name:24s} {f.stat().st_size:>8d} B")
    for fname, d in (("model", tensors), ("reference", reference)):
        for k in sorted(d):
            print(f"    {fname}: {k:45s} {str(d[k].dtype):14s} {list(d[k].shape)}")
    assert total < SIZE_CAP, f"{name} is {total} bytes (cap {SIZE_CAP} B)"


def qwen3_target_embedding():
    """tiny-qwen3's model.embed_tokens.weight (bf16 shard) upcast to float32."""
    d = FIXTURES / "tiny-qwen3"
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.embed_tokens.weight"]
    return load_file(str(d / shard))["model.embed_tokens.weight"].to(torch.float32)


def main():
    # 1. Speculators-format P-EAGLE for tiny-llama, draft vocab 256.
    gen = torch.Generator().manual_seed(1001)
    draft_vocab = 256
    w = make_weights(gen, n_layers=2, draft_vocab=draft_vocab, with_embed=True)
    selected = torch.randperm(TARGET_VOCAB, generator=gen)[:draft_vocab].sort().values
    w["d2t"] = selected - torch.arange(draft_vocab)  # target_id = draft_id + d2t[draft_id]
    t2d = torch.zeros(TARGET_VOCAB, dtype=torch.bool)
    t2d[selected] = True
    w["t2d"] = t2d
    w["mask_hidden"] = torch.randn(1, 1, N_AUX * HIDDEN, generator=gen)
    config = {
        "architectures": ["PEagleSpeculator"],
        "speculators_model_type": "peagle",
        "speculators_version": "0.4.0",
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": False,
        "target_hidden_size": HIDDEN,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "mask_token_id": MASK_TOKEN,
        "transformer_layer_config": {**LAYER_CONFIG, "num_hidden_layers": 2},
        "speculators_config": {
            "algorithm": "peagle",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": 3,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": "tests/fixtures/tiny-llama",
                "architectures": ["LlamaForCausalLM"],
            },
        },
    }
    ref = make_reference(gen, w, w["embed_tokens.weight"], 2, False, w["mask_hidden"])
    write_dir("tiny-llama-peagle", config, w, ref)

    # 2. AWS-layout autoregressive EAGLE-3 for tiny-qwen3: 1 layer, no embedding,
    #    no vocab mapping. Reference uses the target's (bf16 -> f32) embedding.
    gen = torch.Generator().manual_seed(1002)
    w = make_weights(gen, n_layers=1, draft_vocab=TARGET_VOCAB, with_embed=False)
    config = dict(AWS_BASE_CONFIG)
    ref = make_reference(gen, w, qwen3_target_embedding(), 1, False, None)
    write_dir("tiny-qwen3-eagle3", config, to_aws_names(w), ref)

    # 3. AWS-layout P-EAGLE for tiny-llama: 3 layers, norm_before_residual.
    gen = torch.Generator().manual_seed(1003)
    w = make_weights(gen, n_layers=3, draft_vocab=TARGET_VOCAB, with_embed=True)
    w["d2t"] = torch.zeros(TARGET_VOCAB, dtype=torch.int64)
    w["mask_hidden"] = torch.randn(1, N_AUX * HIDDEN, generator=gen)
    config = dict(AWS_BASE_CONFIG)
    config.update(
        {
            "num_hidden_layers": 3,
            "ptd_token_id": MASK_TOKEN,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]},
            "norm_before_residual": True,
        }
    )
    ref = make_reference(gen, w, w["embed_tokens.weight"], 3, True, w["mask_hidden"])
    write_dir("tiny-llama-peagle-aws", config, to_aws_names(w), ref)

    # 4. The published gpt-oss P-EAGLE head's layout, for tiny-gpt-oss: 4 layers, its own
    #    embedding, no vocabulary mapping, aux layers left to the loader's default.
    gen = torch.Generator().manual_seed(1004)
    w = make_weights(gen, n_layers=4, draft_vocab=TARGET_VOCAB, with_embed=True)
    w["mask_hidden"] = torch.randn(1, 1, N_AUX * HIDDEN, generator=gen)
    config = dict(AWS_BASE_CONFIG)
    config.update({"num_hidden_layers": 4, "ptd_token_id": MASK_TOKEN})
    ref = make_reference(gen, w, w["embed_tokens.weight"], 4, False, w["mask_hidden"])
    write_dir("tiny-gpt-oss-peagle", config, to_aws_names(w), ref)


if __name__ == "__main__":
    main()

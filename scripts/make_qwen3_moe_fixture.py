"""Generate the tiny Qwen3-MoE golden fixture under tests/fixtures/tiny-qwen3-moe/.

  tiny-qwen3-moe/   Qwen3MoeForCausalLM, float32, single model.safetensors, 4 layers,
                    4 q heads / 2 kv heads, head_dim 16, Qwen3 qk-norm, plain RoPE
                    (theta 1e6 as tiny-qwen3), untied lm_head, no sliding window.
                    Layers 0, 2, 3: sparse MoE blocks with 4 experts, top-2, norm_topk_prob
                    true, moe_intermediate_size 32, no shared expert. Layer 1 is a dense
                    SwiGLU MLP (mlp_only_layers [1], intermediate_size 64), so the fixture
                    also covers a dense/sparse mix (published Qwen3-MoE checkpoints such as
                    Qwen3-Coder-30B-A3B are all sparse: mlp_only_layers []).

The weights are in the layout of the published Hugging Face Qwen3-MoE checkpoints (e.g.
Qwen/Qwen3-Coder-30B-A3B-Instruct): the router is model.layers.{i}.mlp.gate.weight [E, H]
(no bias) and each expert has its own model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight.
transformers 5 keeps the experts fused in memory (mlp.experts.gate_up_proj [E, 2I, H] and
mlp.experts.down_proj [E, H, I]); its save_pretrained converts them back to the per-expert names,
and this script checks that it did. config.json spells the expert count "num_experts" (as the
published configs do; transformers 5 would write its internal name "num_local_experts") and
carries the transformers-4 keys torch_dtype / rope_theta / rope_scaling like the other fixtures.

The tokenizer, prompts' lengths, greedy steps, generation_config.json, tokenizer_config.json and
the layout of reference.safetensors (p{i}.input_ids, logits, hidden_in, prenorm, greedy; see
scripts/make_fixtures.py) are the shared ones from scripts/make_fixtures.py. The reference comes
from the checkpoint reloaded from disk by transformers (eager attention, eager experts, float32).

Besides the top-1/top-2 logit gap of make_fixtures.py, every prompt (with its greedy
continuation) must route every token with a clear margin between the k-th and (k+1)-th router
logit, so that a different summation order cannot flip an expert choice. The MoE blocks are
recomputed from the per-expert tensors in model.safetensors with the routing written out below
(route()), to check the file layout and the routing description against transformers.

    python3 scripts/make_qwen3_moe_fixture.py
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_fixtures import (  # noqa: E402
    BOS_ID,
    EOS_ID,
    FIXTURES,
    GREEDY_STEPS,
    MIN_TOP2_GAP,
    PROMPT_LENGTHS,
    VOCAB_SIZE,
    build_model,
    forward_with_captures,
    reference_entries,
    greedy,
    print_sizes,
    random_prompt,
    save_checkpoint,
    save_tokenizer,
    train_tokenizer,
    verify_reference,
)

torch.set_num_threads(1)

NAME = "tiny-qwen3-moe"
MODEL_SEED = 4
# Far from the other fixtures' prompt seeds (1000..9000) and from each other.
PROMPT_SEEDS = [10000, 11000, 12000]
# Smallest allowed gap between the k-th and (k+1)-th largest router logit of any token.
MIN_ROUTER_GAP = 1e-3
# The router is scaled up from the std-0.1 init so that routing is decisive (router logits of a
# few units, not a near-uniform softmax) and the renormalised weights differ clearly from 1/k.
ROUTER_SCALE = 3.0
MLP_ONLY_LAYERS = [1]


def config():
    return Qwen3MoeConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=64,  # the dense MLP of the mlp_only_layers
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=MLP_ONLY_LAYERS,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        use_sliding_window=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        initializer_range=0.1,
    )


def sparse_layers(cfg):
    return [
        i
        for i in range(cfg.num_hidden_layers)
        if i not in cfg.mlp_only_layers and cfg.num_experts > 0 and (i + 1) % cfg.decoder_sparse_step == 0
    ]


def make_model():
    # make_fixtures.build_model: HF init (std initializer_range) + all RMSNorm weights perturbed.
    model = build_model(Qwen3MoeForCausalLM, config(), seed=MODEL_SEED)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.mul_(ROUTER_SCALE)
    return model.float().eval()


# ---------------------------------------------------------------- checkpoint --


def write_checkpoint(model, out_dir, tokenizer):
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.iterdir():  # no stale files from an earlier run
        old.unlink()
    save_checkpoint(model, out_dir, torch.float32, max_shard_size="10MB")  # one model.safetensors
    save_tokenizer(tokenizer, out_dir)

    path = out_dir / "config.json"
    cfg = json.loads(path.read_text())
    # The published Qwen3-MoE configs name the expert count "num_experts"; transformers 5 writes
    # its attribute_map target "num_local_experts" instead. Write the published name only.
    cfg["num_experts"] = cfg.pop("num_local_experts")
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    check_layout(model.config, out_dir)


def expected_tensor_shapes(cfg):
    h, i_dense, i_moe, d = cfg.hidden_size, cfg.intermediate_size, cfg.moe_intermediate_size, cfg.head_dim
    shapes = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (cfg.vocab_size, h),
    }
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (cfg.num_attention_heads * d, h),
            p + "self_attn.k_proj.weight": (cfg.num_key_value_heads * d, h),
            p + "self_attn.v_proj.weight": (cfg.num_key_value_heads * d, h),
            p + "self_attn.o_proj.weight": (h, cfg.num_attention_heads * d),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
        })
        if layer in sparse_layers(cfg):
            shapes[p + "mlp.gate.weight"] = (cfg.num_experts, h)
            for e in range(cfg.num_experts):
                shapes.update({
                    p + f"mlp.experts.{e}.gate_proj.weight": (i_moe, h),
                    p + f"mlp.experts.{e}.up_proj.weight": (i_moe, h),
                    p + f"mlp.experts.{e}.down_proj.weight": (h, i_moe),
                })
        else:
            shapes.update({
                p + "mlp.gate_proj.weight": (i_dense, h),
                p + "mlp.up_proj.weight": (i_dense, h),
                p + "mlp.down_proj.weight": (h, i_dense),
            })
    return shapes


def check_layout(cfg, out_dir):
    """model.safetensors holds exactly the published per-expert names, float32."""
    assert sorted(p.name for p in out_dir.glob("model*.safetensors*")) == ["model.safetensors"]
    expected = expected_tensor_shapes(cfg)
    with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
        found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert found == expected, (sorted(set(found) ^ set(expected)), [k for k in found if found[k] != expected.get(k)])
    assert dtypes == {"F32"}, dtypes
    config = json.loads((out_dir / "config.json").read_text())
    for key, value in {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "mlp_only_layers": MLP_ONLY_LAYERS, "head_dim": 16,
        "tie_word_embeddings": False, "rope_theta": 1000000.0, "rope_scaling": None,
        "sliding_window": None, "use_sliding_window": False, "torch_dtype": "float32",
    }.items():
        assert config.get(key) == value, (key, config.get(key))
    assert "num_local_experts" not in config


# ------------------------------------------------------------------ routing --


def route(x, router_weight, top_k, norm_topk_prob):
    """Qwen3-MoE routing as transformers' Qwen3MoeTopKRouter: x [T, H] -> (experts [T, k], weights [T, k]).

    router logits = x @ W^T in x's dtype (no bias); softmax over all experts in float32; top-k
    of the probabilities; if norm_topk_prob, divide the k chosen probabilities by their sum
    (float32); then cast to x's dtype.
    """
    logits = F.linear(x, router_weight)
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return experts, weights.to(logits.dtype)


def moe_block_from_file(x, f, prefix, cfg):
    """One sparse block computed from the per-expert tensors of the checkpoint file."""
    experts, weights = route(x, f.get_tensor(prefix + "gate.weight"), cfg.num_experts_per_tok, cfg.norm_topk_prob)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for slot in range(cfg.num_experts_per_tok):
            p = f"{prefix}experts.{experts[t, slot].item()}."
            xt = x[t]
            act = F.silu(f.get_tensor(p + "gate_proj.weight") @ xt) * (f.get_tensor(p + "up_proj.weight") @ xt)
            out[t] += weights[t, slot] * (f.get_tensor(p + "down_proj.weight") @ act)
    return out


@torch.no_grad()
def mlp_io(model, ids):
    """Input and output of every layer's mlp for one forward over ids."""
    io = {}

    def hook(index):
        def fn(_module, args, output):
            io[index] = (args[0][0].detach().clone(), output[0].detach().clone())

        return fn

    handles = [layer.mlp.register_forward_hook(hook(i)) for i, layer in enumerate(model.model.layers)]
    try:
        model(ids[None, :], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return io


def router_stats(model, ids):
    """Smallest k-th vs (k+1)-th router logit gap over all tokens and sparse layers; expert counts."""
    cfg = model.config
    io = mlp_io(model, ids)
    min_gap, counts = float("inf"), {}
    for layer in sparse_layers(cfg):
        x = io[layer][0]
        logits = F.linear(x, model.model.layers[layer].mlp.gate.weight)
        top = torch.topk(logits, cfg.num_experts_per_tok + 1, dim=-1).values
        k = cfg.num_experts_per_tok
        min_gap = min(min_gap, (top[:, k - 1] - top[:, k]).min().item())
        experts, _ = route(x, model.model.layers[layer].mlp.gate.weight, k, cfg.norm_topk_prob)
        counts[layer] = torch.bincount(experts.flatten(), minlength=cfg.num_experts).tolist()
    return min_gap, counts


@torch.no_grad()
def check_moe_against_file(model, out_dir, ids):
    """transformers' sparse blocks equal the routing of route() over the per-expert file tensors."""
    cfg = model.config
    io = mlp_io(model, ids)
    with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
        for layer in sparse_layers(cfg):
            x, y = io[layer]
            mine = moe_block_from_file(x, f, f"model.layers.{layer}.mlp.", cfg)
            diff = (mine - y).abs().max().item()
            assert diff < 1e-5, f"layer {layer}: MoE from the file differs from transformers by {diff}"
        for layer in sorted(set(range(cfg.num_hidden_layers)) - set(sparse_layers(cfg))):
            x, y = io[layer]
            p = f"model.layers.{layer}.mlp."
            dense = F.linear(
                F.silu(F.linear(x, f.get_tensor(p + "gate_proj.weight"))) * F.linear(x, f.get_tensor(p + "up_proj.weight")),
                f.get_tensor(p + "down_proj.weight"),
            )
            assert (dense - y).abs().max().item() < 1e-5, f"dense layer {layer} differs"
    print("  MoE blocks recomputed from the per-expert file tensors match transformers")


# --------------------------------------------------------------- references --


def load(out_dir, experts_implementation):
    model = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation=experts_implementation
    ).eval()
    assert type(model) is Qwen3MoeForCausalLM
    assert all(p.dtype == torch.float32 for p in model.parameters())
    intended = config()
    for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                "decoder_sparse_step", "mlp_only_layers", "intermediate_size", "head_dim",
                "num_key_value_heads", "rope_parameters", "tie_word_embeddings", "sliding_window"):
        assert getattr(model.config, key) == getattr(intended, key), (key, getattr(model.config, key))
    return model


@torch.no_grad()
def make_reference(model, out_dir):
    tensors = {}
    for i, length in enumerate(PROMPT_LENGTHS):
        seed = PROMPT_SEEDS[i]
        while True:
            ids = random_prompt(seed, length)
            tokens, gap = greedy(model, ids, GREEDY_STEPS)
            # Every token the Rust side routes: the prompt and the greedy continuation.
            router_gap, counts = router_stats(model, torch.cat([ids, tokens]))
            if gap >= MIN_TOP2_GAP and router_gap >= MIN_ROUTER_GAP:
                break
            print(f"  p{i}: seed {seed} has top-2 gap {gap:.2e}, router gap {router_gap:.2e}, trying {seed + 1}")
            seed += 1
        if seed != PROMPT_SEEDS[i]:
            print(f"  !! record PROMPT_SEEDS[{i}] = {seed} in this script")
        logits, hidden_in, prenorm = forward_with_captures(model, ids)
        print(
            f"  p{i}: n={length} seed={seed} min top-2 gap={gap:.4f} min router gap={router_gap:.4f} "
            f"logits std={logits.std().item():.3f} expert use per sparse layer={counts}"
        )
        assert logits.std().item() > 0.5, "logits too flat to be a useful reference"
        tensors.update(reference_entries(i, ids, logits, hidden_in, prenorm, tokens))
    save_file(tensors, str(out_dir / "reference.safetensors"))
    return tensors


@torch.no_grad()
def check_same_logits(model, tensors, what):
    for i in range(len(PROMPT_LENGTHS)):
        logits = model(tensors[f"p{i}.input_ids"][None, :], use_cache=False).logits[0].float()
        diff = (logits - tensors[f"p{i}.logits"]).abs().max().item()
        assert diff < 1e-5, f"{what} p{i}: logits off by {diff}"
    print(f"  {what}: same logits as the reference")


@torch.no_grad()
def check_routing_matters(model, tensors):
    """Routing is non-trivial: all experts get used, and top-1 / all-expert routing changes the logits."""
    cfg = model.config
    ids = torch.cat([tensors[f"p{i}.input_ids"] for i in range(len(PROMPT_LENGTHS))])
    _, counts = router_stats(model, ids)
    for layer, c in counts.items():
        assert min(c) > 0, f"layer {layer}: some expert is never chosen: {c}"
    ref = tensors[f"p{len(PROMPT_LENGTHS) - 1}.logits"]
    for k in (1, cfg.num_experts):
        for layer in sparse_layers(cfg):
            model.model.layers[layer].mlp.gate.top_k = k
        logits = model(tensors[f"p{len(PROMPT_LENGTHS) - 1}.input_ids"][None, :], use_cache=False).logits[0]
        print(f"  top-{k} routing instead of top-{cfg.num_experts_per_tok}: max logit change {(logits - ref).abs().max().item():.3f}")
        assert (logits - ref).abs().max().item() > 0.05
    for layer in sparse_layers(cfg):
        model.model.layers[layer].mlp.gate.top_k = cfg.num_experts_per_tok
    # norm_topk_prob matters too (weights of the chosen experts do not sum to 1 before it).
    for layer in sparse_layers(cfg):
        model.model.layers[layer].mlp.gate.norm_topk_prob = False
    logits = model(tensors[f"p{len(PROMPT_LENGTHS) - 1}.input_ids"][None, :], use_cache=False).logits[0]
    print(f"  without norm_topk_prob: max logit change {(logits - ref).abs().max().item():.3f}")
    assert (logits - ref).abs().max().item() > 0.05
    for layer in sparse_layers(cfg):
        model.model.layers[layer].mlp.gate.norm_topk_prob = cfg.norm_topk_prob


# --------------------------------------------------------------------- main --


def main():
    tokenizer = train_tokenizer()
    out_dir = FIXTURES / NAME
    print(f"{NAME}:")
    model = make_model()
    write_checkpoint(model, out_dir, tokenizer)

    ref_model = load(out_dir, experts_implementation="eager")
    # The reloaded checkpoint is the model that was written.
    probe = random_prompt(PROMPT_SEEDS[0], PROMPT_LENGTHS[-1])
    with torch.no_grad():
        a = model(probe[None, :], use_cache=False).logits
        b = ref_model(probe[None, :], use_cache=False).logits
    assert (a - b).abs().max().item() < 1e-5, (a - b).abs().max().item()

    tensors = make_reference(ref_model, out_dir)
    verify_reference(ref_model, out_dir, tensors)
    check_moe_against_file(ref_model, out_dir, torch.cat([tensors[f"p2.input_ids"], tensors[f"p2.greedy"]]))
    check_routing_matters(ref_model, tensors)
    check_same_logits(load(out_dir, experts_implementation=None), tensors, "transformers' default experts kernel")
    check_same_logits(model, tensors, "the in-memory model before saving")

    with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    layer_of = lambda k: int(m.group(1)) if (m := re.match(r"model\.layers\.(\d+)\.", k)) else -1  # noqa: E731
    print("model.safetensors tensors:")
    with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
        for k in sorted(names, key=lambda k: (layer_of(k), k)):
            print(f"  {k:50s} {tuple(f.get_slice(k).get_shape())}")
    print(f"{out_dir.relative_to(FIXTURES.parent.parent)}:")
    print_sizes(out_dir)
    total = sum(p.stat().st_size for p in out_dir.iterdir())
    assert total < 1.5e6, total


if __name__ == "__main__":
    main()

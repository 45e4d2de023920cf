"""Generate the golden reference fixtures under tests/fixtures/.

Two tiny random-weight checkpoints in standard Hugging Face format:

  tests/fixtures/tiny-llama/   LlamaForCausalLM, float32, single model.safetensors,
                               GQA (4 q heads / 2 kv heads), llama3 rope scaling.
  tests/fixtures/tiny-qwen3/   Qwen3ForCausalLM, bfloat16, sharded safetensors
                               (+ model.safetensors.index.json), head_dim 32 decoupled
                               from hidden_size / num_heads, tied embeddings.

Each directory gets config.json, generation_config.json, the weights, a tiny
byte-level BPE tokenizer (tokenizer.json + tokenizer_config.json with a chat
template) and reference.safetensors holding float32 outputs of the HF model
reloaded from disk (eager attention, float32), for three random prompts i = 0..2:

  p{i}.input_ids  int64   [n]
  p{i}.logits     float32 [n, vocab]
  p{i}.hidden_in  float32 [L, n, hidden]  residual stream entering decoder layer 0..L-1
  p{i}.prenorm    float32 [n, hidden]     last decoder layer output, before model.norm
  p{i}.greedy     int64   [16]            greedy continuation (full forward per step)

Rerun (from the repo root, with the versions in scripts/requirements.txt):

    python3 scripts/make_fixtures.py

Weights are HF's random init (initializer_range 0.1) with all RMSNorm weights
perturbed away from 1. Everything is seeded, so a rerun with the same package versions reproduces the
same files.
"""

import os

# Keep CPU usage to one thread (must be set before torch/tokenizers start up).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

torch.set_num_threads(1)

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"

VOCAB_SIZE = 384
BOS_ID, EOS_ID = 0, 1
SPECIAL_TOKENS = ["<|bos|>", "<|endoftext|>"]  # ids 0 and 1: trained first
PROMPT_LENGTHS = [5, 23, 41]
GREEDY_STEPS = 16
# Rust sums in a different order than torch; a top-1/top-2 logit gap below this
# could flip an argmax, so prompts are re-seeded until every step clears it.
MIN_TOP2_GAP = 1e-3

# Seed of the token ids of each prompt, per fixture. These are the seeds that
# pass the MIN_TOP2_GAP check; if a rerun has to bump one, it prints the new
# value so it can be recorded here.
PROMPT_SEEDS = {
    # Far apart so that bumping one seed never reuses another prompt's seed:
    # with the same seed the shorter prompt would be a prefix of the longer one.
    "tiny-llama": [1000, 2000, 3001],
    "tiny-qwen3": [4000, 5000, 6000],
}

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# A few KB of English and Python for the BPE trainer; any text would do.
TRAINING_TEXT = '''
The quick brown fox jumps over the lazy dog. A language model reads a prompt,
turns it into tokens, and predicts the next token one step at a time. The server
keeps a cache of keys and values so that each new token only needs one more
row of attention instead of a full pass over the whole sequence.
Once upon a time there was a small model that lived inside a test directory.
It had only a few layers and a tiny vocabulary, but it was very proud of its
weights, because they were chosen by a random number generator with a fixed seed.
Every morning the tests would wake it up, feed it a handful of tokens, and check
that its answers matched the reference numbers to within one part in ten thousand.
<|system|>
You are a helpful assistant.
<|user|>
What is the capital of France?
<|assistant|>
The capital of France is Paris.
<|user|>
Write a function that adds two numbers.
<|assistant|>
Here is a simple function in Python:

def add(a, b):
    """Return the sum of a and b."""
    return a + b


def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key, value=1):
        self.counts[key] = self.counts.get(key, 0) + value

    def most_common(self, k):
        items = sorted(self.counts.items(), key=lambda kv: kv[1], reverse=True)
        return items[:k]


def read_lines(path):
    with open(path, "r", encoding="utf-8") as f:
        return [line.rstrip("\\n") for line in f]


if __name__ == "__main__":
    counter = Counter()
    for word in "the cat and the dog and the bird".split():
        counter.add(word)
    print(counter.most_common(3))
    print(fibonacci(10), add(2, 3))

Attention is computed as the softmax of the scaled dot product between queries
and keys, and the result is a weighted sum of the values. Grouped query attention
shares each key and value head between several query heads, which makes the cache
smaller. Rotary position embeddings rotate pairs of features by an angle that
depends on the position and on the frequency of the pair. The root mean square
norm divides each vector by the square root of the mean of its squares, adds a
small epsilon for stability, and multiplies by a learned weight.
In the beginning the weather was cold and the river was frozen. The children
walked to school along the road, talking about the holidays, the snow, and the
things they would do when the spring came back to the village. Their teacher
told them that the world is large and that there are many things still to learn.
for i in range(10):
    if i % 2 == 0:
        print("even", i)
    else:
        print("odd", i)
numbers = [x * x for x in range(20) if x % 3 == 0]
total = sum(numbers)
result = {"total": total, "count": len(numbers), "mean": total / len(numbers)}
'''


# ---------------------------------------------------------------- tokenizer --


def train_tokenizer():
    """Byte-level BPE with exactly VOCAB_SIZE entries (256 bytes + 2 specials + merges)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TRAINING_TEXT], trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    for i, name in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(name) == i, (name, tok.token_to_id(name))
    return tok


def save_tokenizer(tok, out_dir):
    tok.save(str(out_dir / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[BOS_ID],
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "model_max_length": 256,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(out_dir / "tokenizer_config.json", "w") as f:
        json.dump(tokenizer_config, f, indent=2)
        f.write("\n")

    # Round-trip through transformers to make sure the files load as a normal
    # HF tokenizer and the chat template renders as intended.
    hf_tok = AutoTokenizer.from_pretrained(out_dir)
    assert len(hf_tok) == VOCAB_SIZE
    text = hf_tok.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|user|>\nHi there\n<|assistant|>\n", repr(text)
    ids = hf_tok(text)["input_ids"]
    assert hf_tok.decode(ids) == text


# ------------------------------------------------------------------- models --


def llama_config():
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rope_theta=10000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        initializer_range=0.1,
    )


def qwen3_config():
    return Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rope_theta=1000000.0,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        use_sliding_window=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        initializer_range=0.1,
    )


def check_loaded_config(name, loaded):
    """The config read back from disk must still describe the intended model."""
    intended = llama_config() if name == "tiny-llama" else qwen3_config()
    for key in ("head_dim", "num_key_value_heads", "rope_parameters", "tie_word_embeddings"):
        assert getattr(loaded, key) == getattr(intended, key), (key, getattr(loaded, key))


def build_model(model_cls, config, seed):
    torch.manual_seed(seed)
    model = model_cls(config)
    # HF initialises every RMSNorm weight (including Qwen3's q_norm / k_norm)
    # to exactly 1, which would let a Rust implementation that skips or
    # mis-indexes a norm weight pass. Perturb them so they matter.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.2 * torch.randn_like(param))
    return model.eval()


def save_checkpoint(model, out_dir, dtype, max_shard_size):
    model = model.to(dtype)
    # transformers 5 always writes safetensors (no safe_serialization flag).
    model.save_pretrained(out_dir, max_shard_size=max_shard_size)
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID).save_pretrained(out_dir)
    add_legacy_config_keys(out_dir / "config.json")


def add_legacy_config_keys(path):
    """Mirror transformers-5 config keys under their transformers-4 names.

    transformers 5 writes "dtype" and folds rope_theta / rope_scaling into
    "rope_parameters", but most checkpoints in the wild (Llama 3, Qwen3) carry
    "torch_dtype", "rope_theta" and "rope_scaling". Write both spellings so
    either kind of parser reads the same values; transformers 5 accepts both.
    """
    config = json.loads(path.read_text())
    config["torch_dtype"] = config["dtype"]
    rope = dict(config["rope_parameters"])
    config["rope_theta"] = rope.pop("rope_theta")
    # Plain RoPE was "rope_scaling": null in transformers-4 configs.
    config["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------- references --


def random_prompt(seed, length):
    gen = torch.Generator().manual_seed(seed)
    # ids 0 and 1 are the special tokens; keep prompts to ordinary tokens.
    return torch.randint(2, VOCAB_SIZE, (length,), generator=gen, dtype=torch.int64)


def reference_entries(i, ids, logits, hidden_in, prenorm, tokens):
    """Prompt i's tensors in reference.safetensors, as the Rust golden tests read them."""
    return {
        f"p{i}.input_ids": ids.contiguous(),
        f"p{i}.logits": logits.float().contiguous(),
        f"p{i}.hidden_in": hidden_in.float().contiguous(),
        f"p{i}.prenorm": prenorm.float().contiguous(),
        f"p{i}.greedy": tokens.contiguous(),
    }


def forward_with_captures(model, ids):
    """One forward over the whole prompt; returns logits, hidden_in, prenorm."""
    layers = model.model.layers
    layer_inputs = [None] * len(layers)
    captured = {}

    def grab_layer_input(index):
        def hook(_module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            layer_inputs[index] = x.detach().clone()

        return hook

    def grab_norm_input(_module, args):
        captured["prenorm"] = args[0].detach().clone()

    handles = [
        layer.register_forward_pre_hook(grab_layer_input(i), with_kwargs=True)
        for i, layer in enumerate(layers)
    ]
    handles.append(model.model.norm.register_forward_pre_hook(grab_norm_input))
    try:
        out = model(ids[None, :], output_hidden_states=True, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()

    hidden = out.hidden_states
    assert len(hidden) == len(layers) + 1, len(hidden)
    # hidden_states[0..L] are the inputs of layers 0..L-1 (element 0 is the
    # embedding output); check that against what the layers actually received.
    for i, x in enumerate(layer_inputs):
        assert torch.equal(hidden[i], x), f"hidden_states[{i}] is not layer {i}'s input"
    # The last hidden state HF reports already went through the final norm;
    # check the hook caught its input rather than some other tensor.
    prenorm = captured["prenorm"][0]
    torch.testing.assert_close(model.model.norm(prenorm), hidden[-1][0], rtol=0, atol=1e-5)
    hidden_in = torch.stack([h[0] for h in hidden[: len(layers)]])
    return out.logits[0], hidden_in, prenorm


def greedy(model, ids, steps):
    """Greedy continuation by repeated full forwards; also the smallest top-1/top-2 gap."""
    seq = ids.clone()
    new_tokens, min_gap = [], float("inf")
    for _ in range(steps):
        last = model(seq[None, :], use_cache=False).logits[0, -1]
        top2 = torch.topk(last, 2).values
        min_gap = min(min_gap, (top2[0] - top2[1]).item())
        nxt = torch.argmax(last).reshape(1)
        new_tokens.append(nxt)
        seq = torch.cat([seq, nxt])
    return torch.cat(new_tokens), min_gap


@torch.no_grad()
def make_reference(name, out_dir):
    model = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.model.rotary_emb.rope_type == model.config.rope_parameters["rope_type"]
    check_loaded_config(name, model.config)
    tensors = {}
    for i, length in enumerate(PROMPT_LENGTHS):
        seed = PROMPT_SEEDS[name][i]
        while True:
            ids = random_prompt(seed, length)
            tokens, gap = greedy(model, ids, GREEDY_STEPS)
            if gap >= MIN_TOP2_GAP:
                break
            print(f"  {name} p{i}: seed {seed} has top-2 gap {gap:.2e}, trying {seed + 1}")
            seed += 1
        if seed != PROMPT_SEEDS[name][i]:
            print(f"  !! record PROMPT_SEEDS[{name!r}][{i}] = {seed} in this script")
        logits, hidden_in, prenorm = forward_with_captures(model, ids)
        print(
            f"  p{i}: n={length} seed={seed} min top-2 gap={gap:.4f} "
            f"logits std={logits.std().item():.3f}"
        )
        assert logits.std().item() > 0.5, "logits too flat to be a useful reference"
        tensors.update(reference_entries(i, ids, logits, hidden_in, prenorm, tokens))
    path = out_dir / "reference.safetensors"
    save_file(tensors, str(path))
    return model, tensors


def verify_reference(model, out_dir, expected):
    """Re-read reference.safetensors and check shapes, dtypes and values."""
    cfg = model.config
    loaded = load_file(str(out_dir / "reference.safetensors"))
    assert set(loaded) == set(expected)
    for i, n in enumerate(PROMPT_LENGTHS):
        shapes = {
            "input_ids": ((n,), torch.int64),
            "logits": ((n, cfg.vocab_size), torch.float32),
            "hidden_in": ((cfg.num_hidden_layers, n, cfg.hidden_size), torch.float32),
            "prenorm": ((n, cfg.hidden_size), torch.float32),
            "greedy": ((GREEDY_STEPS,), torch.int64),
        }
        for key, (shape, dtype) in shapes.items():
            t = loaded[f"p{i}.{key}"]
            assert tuple(t.shape) == shape and t.dtype == dtype, (key, t.shape, t.dtype)
            assert torch.equal(t, expected[f"p{i}.{key}"]), key
        # The logits must follow from prenorm through the final norm and lm_head.
        with torch.no_grad():
            logits = model.lm_head(model.model.norm(loaded[f"p{i}.prenorm"]))
        torch.testing.assert_close(logits, loaded[f"p{i}.logits"], rtol=0, atol=1e-5)


def print_sizes(out_dir):
    total = 0
    for path in sorted(out_dir.iterdir()):
        size = path.stat().st_size
        total += size
        print(f"  {path.name:40s} {size:>9,d} B")
    print(f"  {'total':40s} {total:>9,d} B")


# --------------------------------------------------------------------- main --


def make_fixture(name, model, dtype, max_shard_size, tokenizer):
    out_dir = FIXTURES / name
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.iterdir():  # no stale shards from an earlier run
        old.unlink()
    print(f"{name}:")
    save_checkpoint(model, out_dir, dtype, max_shard_size)
    save_tokenizer(tokenizer, out_dir)
    ref_model, tensors = make_reference(name, out_dir)
    verify_reference(ref_model, out_dir, tensors)
    return out_dir


def main():
    tokenizer = train_tokenizer()

    llama_dir = make_fixture(
        "tiny-llama",
        build_model(LlamaForCausalLM, llama_config(), seed=1),
        dtype=torch.float32,
        max_shard_size="10MB",  # one file: model.safetensors
        tokenizer=tokenizer,
    )
    assert (llama_dir / "model.safetensors").exists()

    qwen_dir = make_fixture(
        "tiny-qwen3",
        build_model(Qwen3ForCausalLM, qwen3_config(), seed=2),
        dtype=torch.bfloat16,
        max_shard_size="200KB",  # the model is ~640 KB in bf16: forces several shards
        tokenizer=tokenizer,
    )
    shards = sorted(qwen_dir.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2 and (qwen_dir / "model.safetensors.index.json").exists()
    config = json.loads((qwen_dir / "config.json").read_text())
    assert config.get("torch_dtype") == "bfloat16", config.get("torch_dtype")

    for out_dir in (llama_dir, qwen_dir):
        print(f"{out_dir.relative_to(FIXTURES.parent.parent)}:")
        print_sizes(out_dir)


if __name__ == "__main__":
    main()

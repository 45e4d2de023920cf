"""HF transformers `generate` on the demo model, the peer of peagle's GPU bench: greedy, bf16,
one prompt at a time (concurrency 1), on the same GPU and prompts. Writes tokens/s as JSON.

    python3 scripts/gpu_transformers_peer.py --model models/pystdlib-12l \
        --dataset models/pystdlib-12l/eval_prompts.jsonl --num-prompts 16 --max-tokens 128 --out peer.json
"""

import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda().eval()
    with open(args.dataset) as f:
        prompts = [json.loads(line)["prompt"] for line in f][: args.num_prompts]

    def run(prompt):
        ids = tokenizer(prompt, return_tensors="pt").input_ids.cuda()
        out = model.generate(ids, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens,
                             do_sample=False, pad_token_id=tokenizer.eos_token_id)
        return out.shape[1] - ids.shape[1]

    with torch.inference_mode():
        run(prompts[0])  # warm-up: kernels load and autotune
        torch.cuda.synchronize()
        start = time.perf_counter()
        tokens = sum(run(p) for p in prompts)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    result = {
        "peer": f"transformers {__import__('transformers').__version__} generate, torch {torch.__version__}",
        "num_prompts": len(prompts),
        "generated_tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

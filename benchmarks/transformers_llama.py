"""Issue 27's speed rows: one training step (forward + backward) of a small Llama through
transformers, ``attn_implementation="portattn"`` against ``"sdpa"``, on one GPU; and one greedy
decode step of a batch against its KV cache.

Model: 2 layers, 16 query heads on 4 kv heads (GQA), head dim 64 or 128 (hidden 16 x D), MLP
4 x hidden, vocab 4096, bf16, random weights. Workloads of 8192 tokens:
  * dense 4 x 2048 (no mask: the dense path, batch folded into tokens);
  * packed 1 x 8192, four sequences of 2048 whose position_ids restart (portattn: varlen;
    sdpa: the block-causal mask transformers builds from them);
  * decode: 8 sequences of 2048 tokens in the cache, one new token each (an all-ones mask, as
    generate passes: portattn reads the [B, H, S, D] cache in place, heads fold).
Timing: ``benchmarks.timing.gpu_timer`` (do_bench medians, L2 flushed), each
implementation warmed first, two passes in alternating order, the better median kept.

    python benchmarks/transformers_llama.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if not __package__:  # run by path: the checkout's root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.timing import gpu_timer

IMPLS = ("portattn", "sdpa")
SEQ, BATCH = 2048, 4
DECODE_BATCH = 8


def make_model(head_dim: int, impl: str):
    from transformers import AutoModelForCausalLM, LlamaConfig

    hidden = 16 * head_dim
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=2,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=head_dim,
        max_position_embeddings=4 * SEQ * 2,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=torch.bfloat16)
    return model.cuda()


def training_steps(model, device: torch.device) -> dict[str, callable]:
    gen = torch.Generator().manual_seed(1)
    dense = torch.randint(0, 4096, (BATCH, SEQ), generator=gen).to(device)
    packed = dense.reshape(1, -1)
    positions = torch.arange(SEQ, device=device).repeat(BATCH)[None]

    def dense_step():
        model.zero_grad(set_to_none=True)
        model(dense, labels=dense).loss.backward()

    def packed_step():
        model.zero_grad(set_to_none=True)
        model(packed, position_ids=positions, labels=packed).loss.backward()

    return {"dense 4x2048 fwd+bwd": dense_step, "packed 1x8192 fwd+bwd": packed_step}


def decode_step(model, device: torch.device):
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 4096, (DECODE_BATCH, SEQ), generator=gen).to(device)
    mask = torch.ones(DECODE_BATCH, SEQ + 1, dtype=torch.long, device=device)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(prompt, attention_mask=mask[:, :-1], past_key_values=cache, use_cache=True)
    token = prompt[:, -1:]
    position = torch.full((DECODE_BATCH, 1), SEQ, device=device)

    def step():
        with torch.no_grad():
            model(token, attention_mask=mask, past_key_values=cache, position_ids=position)
        cache.crop(-1)  # back to the prompt: every call appends the same one token

    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    import portattn.integrations.transformers as portattn_hf

    portattn_hf.register()
    device = torch.device("cuda")
    rows = []
    for head_dim in (64, 128):
        models = {impl: make_model(head_dim, impl) for impl in IMPLS}
        steps = {impl: training_steps(m, device) for impl, m in models.items()}
        for impl, m in models.items():
            steps[impl]["decode 8x2048 +1 token"] = decode_step(m, device)
        for name in steps["portattn"]:
            best = {impl: float("inf") for impl in IMPLS}
            for order in (IMPLS, IMPLS[::-1]):
                for impl in order:
                    ms, _, _ = gpu_timer(steps[impl][name])
                    best[impl] = min(best[impl], ms)
            row = {"head_dim": head_dim, "workload": name, **{f"{i} ms": best[i] for i in IMPLS}}
            row["sdpa / portattn"] = best["sdpa"] / best["portattn"]
            rows.append(row)
            print(
                f"d{head_dim:<4} {name:26s} portattn {best['portattn']:8.3f} ms  "
                f"sdpa {best['sdpa']:8.3f} ms  speed vs sdpa {row['sdpa / portattn']:.2f}x",
                flush=True,
            )
        del models, steps
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

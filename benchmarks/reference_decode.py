"""Torch reference decode speed on the default model: ms/token, target-only vs speculative.

    python benchmarks/reference_decode.py [--tokens 64] [--draft default|random|DIR|none]

Prints medians over the prompts, measured side by side (interleaved) in one run.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from dflash_edge.models import load_target
from dflash_edge.models.fetch import fetch_default_model
from dflash_edge.models.reference_loop import (
    GenerationConfig,
    speculative_generate,
    target_generate,
)
from dflash_edge.models.resolve_drafter import resolve_drafter
from dflash_edge.runtime.tokenizer import ChatTokenizer

PROMPTS = [
    "Why is the sky blue?",
    "Write a Python function that checks whether a number is prime.",
    "Give me three tips for a job interview.",
    "What is 17 times 23? Explain step by step.",
    "Summarise the plot of Romeo and Juliet in three sentences.",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--draft", default="default")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = fetch_default_model()
    target, tok = load_target(path), ChatTokenizer.from_dir(path)
    drafter = None if args.draft == "none" else resolve_drafter(args.draft, target, tok)
    gen = GenerationConfig(max_new_tokens=args.tokens, stop_token_ids=())
    ar_ms, spec_ms, tau = [], [], []
    for prompt in PROMPTS:
        ids = tok.encode_chat([{"role": "user", "content": prompt}])
        a = target_generate(target, ids, gen)
        ar_ms.append(1e3 / a.decode_tokens_per_s)
        if drafter is None:
            continue
        s = speculative_generate(target, drafter, ids, gen)
        assert a.token_ids == s.token_ids, "speculative output differs from target-only output"
        spec_ms.append(1e3 / s.decode_tokens_per_s)
        tau.append(s.mean_acceptance_length)
    print(
        f"torch {torch.__version__}, {args.threads} threads, {len(PROMPTS)} prompts x "
        f"{args.tokens} tokens"
    )
    print(f"target-only decode: median {statistics.median(ar_ms):.1f} ms/token")
    if drafter is None:
        return
    print(
        f"speculative ({args.draft} drafter): median {statistics.median(spec_ms):.1f} ms/token, "
        f"median tau {statistics.median(tau):.2f}, speed ratio "
        f"{statistics.median(ar_ms) / statistics.median(spec_ms):.2f}x"
    )


if __name__ == "__main__":
    main()

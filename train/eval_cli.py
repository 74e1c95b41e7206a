"""`dflash-edge eval-drafter`: τ per category and per-position acceptance on held-out prompts.

    dflash-edge eval-drafter --target default --draft drafters/smollm2-135m-instruct \\
        --prompts train/data/heldout_prompts.jsonl --block-size 16
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared CPUs (see train_cli)

import json  # noqa: E402
from pathlib import Path  # noqa: E402


def add_arguments(p) -> None:
    from .prompts import HELDOUT_FILE

    p.add_argument("--target", default="default", help="checkpoint dir, or 'default'")
    p.add_argument("--draft", default="default", help="drafter dir, or 'default' (the shipped one)")
    p.add_argument("--prompts", default=str(HELDOUT_FILE), help="JSONL with 'prompt' and 'category' fields")
    p.add_argument("--block-size", type=int, default=None, help="default: the drafter's trained block size")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--limit", type=int, default=0, help="evaluate only N prompts, evenly spread over the file")
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.add_argument("--threads", type=int, default=2)


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from dflash_edge.export.resolve_drafter import resolve_drafter

    from .evaluate import EvalSpec, format_report, reference_eval
    from .prompts import read_jsonl
    from .recipe import encode_prompt, load_target_and_tokenizer, spread

    torch.set_num_threads(args.threads)
    target, tok, _ = load_target_and_tokenizer(args.target)
    drafter = resolve_drafter(args.draft, target, tok)
    rows = spread(read_jsonl(args.prompts), args.limit)
    spec = EvalSpec(block_size=args.block_size or drafter.config.block_size, max_new_tokens=args.max_new_tokens)
    bar = tqdm(total=len(rows), desc="eval", unit="prompt")

    def progress(rep):
        bar.update(1)
        bar.set_postfix(tau=f"{rep.tau():.2f}")

    rep = reference_eval(target, drafter, [encode_prompt(tok, r["prompt"]) for r in rows],
                         [r.get("category", "all") for r in rows], spec, progress)
    bar.close()
    print(f"drafter {getattr(drafter, 'source', args.draft)} on {len(rows)} prompts from {args.prompts}")
    print(format_report(rep))
    if args.json:
        Path(args.json).write_text(json.dumps({"prompts": args.prompts, **rep.to_dict()}, indent=2) + "\n")
    return 0

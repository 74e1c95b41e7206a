"""`dflash-edge eval-drafter`: τ per category and per-position acceptance on held-out prompts.

dflash-edge eval-drafter --target default --draft default --prompts heldout --block-size 16
"""

from __future__ import annotations

import os

from .common import add_model_args, add_prompts_arg, load_prompts

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # shared CPUs (see train_cli)

import json  # noqa: E402
from pathlib import Path  # noqa: E402


def add_arguments(p) -> None:

    add_model_args(p)
    add_prompts_arg(p, "heldout", "prompts with a 'category' each")
    p.add_argument(
        "--block-size", type=int, default=None, help="default: the drafter's trained block size"
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--limit", type=int, default=0, help="evaluate only N prompts, evenly spread over the file"
    )
    p.add_argument("--json", help="also write the report as JSON to this file")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--replay",
        action="store_true",
        help="generate the target's greedy responses in batches, then replay the drafter on them "
        "(the same acceptance as the reference loop, several times faster)",
    )


def run(args) -> int:
    import torch
    from tqdm import tqdm

    from ..models.resolve_drafter import resolve_drafter
    from ..train.evaluate import EvalSpec, format_report, reference_eval
    from ..train.recipe import encode_prompt, load_target_and_tokenizer, spread

    torch.set_num_threads(args.threads)
    target, tok, _ = load_target_and_tokenizer(args.target)
    drafter = resolve_drafter(args.draft, target, tok)

    rows = spread(load_prompts(args.prompts, default="heldout"), args.limit)
    spec = EvalSpec(
        block_size=args.block_size or drafter.config.block_size, max_new_tokens=args.max_new_tokens
    )
    bar = tqdm(total=len(rows), desc="eval", unit="prompt")

    def progress(rep, prompts: int = 1):
        bar.update(prompts)
        bar.set_postfix(tau=f"{rep.tau():.2f}")

    ids, cats = (
        [encode_prompt(tok, r["prompt"]) for r in rows],
        [r.get("category", "all") for r in rows],
    )
    if args.replay:
        rep = replayed(target, drafter, ids, cats, spec, progress)
    else:
        rep = reference_eval(target, drafter, ids, cats, spec, progress)
    bar.close()
    how = "replayed on batched greedy responses" if args.replay else "reference loop"
    print(
        f"drafter {getattr(drafter, 'source', args.draft)} on {len(rows)} prompts from "
        f"{args.prompts or 'heldout'} ({how})"
    )
    print(format_report(rep))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"prompts": args.prompts, **rep.to_dict()}, indent=2) + "\n"
        )
    return 0


REPLAY_BATCH = 16  # prompts generated together (of similar length) before replaying them


def replayed(target, drafter, prompt_ids, categories, spec, progress=None):
    """Greedy target responses (fp32, batches of REPLAY_BATCH prompts of similar length) with
    features, then `replay_eval`."""
    import torch

    from ..train.evaluate import AcceptanceReport, replay_eval
    from ..train.responses import GenSpec, generate_batch, plan_batches

    gen = GenSpec(
        capture=tuple(drafter.config.target_layer_ids),
        max_new_tokens=spec.max_new_tokens,
        sampled_fraction=0.0,
        dtype="float32",
    )
    rep = AcceptanceReport(spec.block_size)
    for rows in plan_batches(prompt_ids, REPLAY_BATCH):
        samples = generate_batch(
            target, [prompt_ids[i] for i in rows], gen, torch.Generator().manual_seed(0)
        )
        part = replay_eval(
            drafter,
            target.model.embed_tokens,
            target.lm_head.weight.detach(),
            samples,
            [categories[i] for i in rows],
            spec,
        )
        for cat, lengths in part.steps.items():
            rep.add(cat, lengths)
        if progress:
            progress(rep, len(rows))
    return rep

"""`dflash-edge generate`: the torch reference loop on a checkpoint (no export needed)."""

from __future__ import annotations

import sys

from ..models import load_target
from ..models.fetch import resolve_target
from .common import add_model_args


def add_arguments(p) -> None:

    p.add_argument("--prompt", required=True, help="user message (wrapped in the chat template)")
    add_model_args(p)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--block-size", type=int, default=None, help="default: the drafter's trained block size"
    )
    p.add_argument("--raw", action="store_true", help="send the prompt without the chat template")
    p.add_argument(
        "--parse-special",
        action="store_true",
        help="with --raw: control-token strings in the prompt become control tokens "
        "(default: text)",
    )
    p.add_argument(
        "--no-draft", action="store_true", help="target-only autoregressive decoding (the baseline)"
    )


def run(args) -> int:
    from ..models.reference_loop import GenerationConfig, speculative_generate, target_generate
    from ..models.resolve_drafter import resolve_drafter
    from ..runtime.sampling import SamplingParams
    from ..runtime.tokenizer import ChatTokenizer

    path = resolve_target(None if args.target == "default" else args.target)
    target = load_target(path)
    tok = ChatTokenizer.from_dir(path)
    message = [{"role": "user", "content": args.prompt}]
    ids = tok.encode(args.prompt, args.parse_special) if args.raw else tok.encode_chat(message)
    gen = GenerationConfig(
        max_new_tokens=args.max_new_tokens,
        block_size=args.block_size,
        sampling=SamplingParams(args.temperature, args.top_k, args.top_p, args.seed),
    )
    if args.no_draft:
        res = target_generate(target, ids, gen)
    else:
        drafter = resolve_drafter(args.draft, target, tok)
        res = speculative_generate(target, drafter, ids, gen)
    print(tok.decode(res.token_ids))
    stats = (
        f"{len(res.token_ids)} tokens, {res.decode_tokens_per_s:.1f} tok/s decode, "
        f"prefill {res.prefill_s * 1e3:.0f} ms"
    )
    if not args.no_draft:
        stats += (
            f", mean acceptance length {res.mean_acceptance_length:.2f} "
            f"over {len(res.acceptance_lengths)} steps"
        )
    print(f"[{stats}; finish: {res.finish_reason}]", file=sys.stderr)
    return 0

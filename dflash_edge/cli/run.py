"""`dflash-edge run BUNDLE --prompt TEXT`: stream a reply through the runtime; stats go to stderr."""
from __future__ import annotations

import sys


def add_arguments(p) -> None:
    from dflash_edge.runtime.validate import DRAFT_MODES

    from .common import add_thread_args

    p.add_argument("bundle", help="bundle directory (from `dflash-edge export --out DIR`)")
    p.add_argument("--prompt", required=True, help="user message (wrapped in the chat template unless --raw)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="send the prompt without the chat template")
    draft = p.add_mutually_exclusive_group()
    draft.add_argument("--draft", choices=list(DRAFT_MODES), default="auto",
                       help="where proposals come from: " + "; ".join(f"{m}: {w}" for m, w in DRAFT_MODES.items())
                            + " (default auto, seeded by tuned.json)")
    draft.add_argument("--no-draft", dest="draft", action="store_const", const="none",
                       help="= --draft none: plain autoregressive decoding (the baseline)")
    draft.add_argument("--always-draft", dest="draft", action="store_const", const="drafter",
                       help="= --draft drafter: draft every step")
    draft.add_argument("--auto-draft", dest="draft", action="store_const", const="auto", help="= --draft auto")
    p.add_argument("--verify-len", type=int, default=None, help="drafts verified per step, 1..block size - 1 "
                                                                "(default: tuned / adaptive)")
    p.add_argument("--provider", default="cpu", help="cpu | cuda | tensorrt")
    add_thread_args(p)


def run(args) -> int:
    from dflash_edge.runtime.generator import Generator
    from dflash_edge.runtime.validate import CLI_LABELS, GenerationOptions, check_prompt

    prompt = check_prompt(args.prompt, CLI_LABELS["prompt"])     # all checked before the bundle loads (seconds)
    options = GenerationOptions(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed, args.stop,
                                not args.raw, args.draft, args.verify_len).checked(CLI_LABELS)
    gen = Generator.load(args.bundle, provider=args.provider, threads=args.threads, spin=args.spin)
    stream = gen.stream(prompt, options.checked(CLI_LABELS, gen.block_size))      # verify_len vs the block size
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(f"[{stream.result.stats.summary()}]", file=sys.stderr)
    return 0

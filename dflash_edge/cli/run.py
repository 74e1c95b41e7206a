"""`dflash-edge run BUNDLE --prompt TEXT`: stream a reply through the runtime; stats go to stderr."""
from __future__ import annotations

import sys


def add_arguments(p) -> None:
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
    p.add_argument("--no-draft", action="store_true", help="plain autoregressive decoding (the baseline)")
    p.add_argument("--always-draft", action="store_true", help="draft every step (default: per step, what is "
                                                                   "measured to pay, seeded by tuned.json)")
    p.add_argument("--auto-draft", action="store_true", help="no effect: adaptive drafting is the default")
    p.add_argument("--verify-len", type=int, default=None, help="drafts verified per step, 1..block size - 1 "
                                                                "(default: tuned / adaptive)")
    p.add_argument("--provider", default="cpu", help="cpu | cuda | tensorrt")
    add_thread_args(p)


def run(args) -> int:
    from dflash_edge.runtime.generator import Generator
    from dflash_edge.runtime.validate import CLI_LABELS, GenerationArgs

    a = GenerationArgs(args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed,
                       args.stop, not args.raw, False if args.no_draft else True if args.always_draft else "auto")
    a = a.checked(CLI_LABELS)                                  # before the bundle loads (seconds)
    gen = Generator.load(args.bundle, provider=args.provider, threads=args.threads, spin=args.spin)
    stream = gen.stream(a.prompt, max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=a.top_k,
                        top_p=a.top_p, seed=a.seed, stop=a.stop, chat=a.chat, use_draft=a.use_draft,
                        verify_len=args.verify_len)
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    print(f"[{stream.result.stats.summary()}]", file=sys.stderr)
    return 0

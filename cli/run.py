"""`dflash-edge run BUNDLE --prompt TEXT`: stream a reply through the runtime; stats go to stderr:

12 tokens at 85.3 tokens/s, 1.42x plain decoding (60.1 tokens/s, estimated from tune);
    TTFT 40 ms ...
drafted: drafter 2.31 tokens/step over 4 steps, prompt lookup 1.49 tokens/step over 41 steps,
    6 plain steps
ran: target_fused int4, int8 KV cache; drafter fp32; cpu, 2 threads
"""

from __future__ import annotations

import sys

from ..runtime.session import default_threads
from ..runtime.validate import CLI_LABELS, DRAFT_MODES, GenerationOptions, check_prompt
from .common import add_provider_arg, add_thread_args


def add_arguments(p) -> None:

    p.add_argument("bundle", help="bundle directory (from `dflash-edge export --out DIR`)")
    p.add_argument(
        "--prompt", required=True, help="user message (wrapped in the chat template unless --raw)"
    )
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="send the prompt without the chat template")
    p.add_argument(
        "--parse-special",
        action="store_true",
        help="with --raw: control-token strings in the prompt (<|im_start|>...) become control "
        "tokens, "
        "for a prompt that spells out its own template (default: they are text)",
    )
    draft = p.add_mutually_exclusive_group()
    draft.add_argument(
        "--draft",
        choices=list(DRAFT_MODES),
        default="auto",
        help="where proposals come from: "
        + "; ".join(f"{m}: {w}" for m, w in DRAFT_MODES.items())
        + " (default auto, seeded by tuned.json)",
    )
    draft.add_argument(
        "--no-draft",
        dest="draft",
        action="store_const",
        const="none",
        help="= --draft none: plain autoregressive decoding (the baseline)",
    )
    draft.add_argument(
        "--always-draft",
        dest="draft",
        action="store_const",
        const="drafter",
        help="= --draft drafter: draft every step",
    )
    draft.add_argument(
        "--auto-draft", dest="draft", action="store_const", const="auto", help="= --draft auto"
    )
    p.add_argument(
        "--verify-len",
        type=int,
        default=None,
        help="drafts verified per step, 1..block size - 1 (default: tuned / adaptive)",
    )
    add_provider_arg(p)
    add_thread_args(p)


def run(args) -> int:
    from ..runtime.generator import Generator

    # all checked before loading
    prompt = check_prompt(args.prompt, CLI_LABELS["prompt"], chat=not args.raw)
    options = GenerationOptions(
        args.max_new_tokens,
        args.temperature,
        args.top_k,
        args.top_p,
        args.seed,
        args.stop,
        not args.raw,
        args.draft,
        args.verify_len,
        args.parse_special,
    ).checked(CLI_LABELS)
    gen = Generator.load(args.bundle, provider=args.provider, threads=args.threads, spin=args.spin)
    # verify_len vs the block size
    stream = gen.stream(prompt, options.checked(CLI_LABELS, gen.block_size))
    for piece in stream:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()  # the text ends before the stats (stderr) begin
    print(summary(stream.result.stats, gen, args.provider, args.threads), file=sys.stderr)
    return 0


def summary(stats, gen, provider: str = "cpu", threads: int = 0) -> str:
    """Three lines for a newcomer: the speed and how it compares with plain decoding (from `tune`'s
    measurement when the bundle has one, else from this run's plain steps; which, is said), what
    drafted, what ran."""

    rate, first = (
        stats.decode_tokens_per_s,
        f"{stats.new_tokens} tokens at {stats.decode_tokens_per_s:.1f} tokens/s",
    )
    drafted = stats.acceptance_lengths or stats.lookup_lengths
    if not drafted:
        first += ", plain decoding (the baseline)"
    elif gen.tuned is not None:
        plain = 1e3 / gen.tuned.decode_ms
        first += f", {rate / plain:.2f}x plain decoding ({plain:.1f} tokens/s, estimated from tune)"
    elif stats.plain_tokens_per_s > 0:
        plain = stats.plain_tokens_per_s
        first += (
            f", {rate / plain:.2f}x plain decoding ({plain:.1f} tokens/s, measured on this run's "
            f"{stats.plain_timed_steps} plain steps)"
        )
    else:
        first += (
            ", speed against plain decoding unknown "
            f"(run `dflash-edge tune {gen.bundle.root}` to measure it)"
        )
    first += (
        f"; TTFT {stats.ttft_s * 1e3:.0f} ms (prompt {stats.prompt_tokens} tokens); "
        f"finish: {stats.finish_reason}"
    )
    graphs, name = gen.bundle.manifest["graphs"], gen.target_graph
    kv = {"float32": "fp32", "float16": "fp16"}.get(
        gen.bundle.graph_kv_dtype(name), gen.bundle.graph_kv_dtype(name)
    )
    threads = threads or default_threads()
    ran = (
        f"ran: {name} {graphs[name]['precision']}, {kv} KV cache; drafter "
        f"{graphs['drafter']['precision']}; "
        f"{provider}, {threads} thread{'' if threads == 1 else 's'}"
    )
    return f"{first}\ndrafted: {stats.sources()}\n{ran}"

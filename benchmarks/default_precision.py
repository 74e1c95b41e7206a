"""Which precision the default bundle should run (issue 27): quality against the fp32 bundle, side
by side.

For each candidate bundle: quantize/quality.py's report against the fp32 reference (top-1 agreement
and perplexity, teacher-forced over held-out replies; acceptance length of its drafter), plus greedy
text: how many of N chat prompts give the fp32 bundle's exact 64-token plain reply.

    python benchmarks/default_precision.py /tmp/b/fp32 int4=/tmp/b/int4 int4-kv8=/tmp/b/default \\
        [--prompts heldout] [--texts 8] [--new-tokens 64] [--positions 2048] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys


def greedy_texts(bundle, prompts: list[str], new_tokens: int, threads: int) -> list[list[int]]:
    from dflash_edge.runtime import GenerationOptions, Generator

    gen = Generator.load(bundle, threads=threads)
    opts = GenerationOptions(max_new_tokens=new_tokens, draft="none")
    return [gen.generate(p, opts).token_ids for p in prompts]


def main(argv=None) -> int:
    from dflash_edge.data import read_prompts
    from dflash_edge.quantize.quality import ReportOptions, quality_report

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("fp32", help="the fp32 reference bundle")
    p.add_argument("candidates", nargs="+", help="NAME=BUNDLE")
    p.add_argument("--prompts", default="heldout")
    p.add_argument("--texts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--positions", type=int, default=2048)
    p.add_argument("--accept-prompts", type=int, default=8)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument(
        "--no-report", action="store_true", help="greedy text only (no teacher-forced report)"
    )
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    prompts = [r["prompt"] for r in read_prompts(args.prompts, limit=args.texts)]
    reference = greedy_texts(args.fp32, prompts, args.new_tokens, args.threads)
    rows = {}
    for spec in args.candidates:
        name, bundle = spec.split("=", 1)
        texts = greedy_texts(bundle, prompts, args.new_tokens, args.threads)
        report = (
            {}
            if args.no_report
            else quality_report(
                args.fp32,
                bundle,
                ReportOptions(
                    positions=args.positions,
                    accept_prompts=args.accept_prompts,
                    prompts=args.prompts,
                    threads=args.threads,
                ),
                log=sys.stderr,
            )
        )
        same = [
            next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            for a, b in zip(texts, reference)
        ]
        rows[name] = {
            "greedy_equal": sum(a == b for a, b in zip(texts, reference)),
            "texts": len(prompts),
            "same_prefix_tokens": same,
            "top1_agreement": report.get("top1_agreement"),
            "report": report,
        }
        top1 = f"; top-1 {report['top1_agreement']:.4f}" if report else ""
        print(
            f"{name:12s} greedy text = fp32 on {rows[name]['greedy_equal']}/{len(prompts)} "
            f"({args.new_tokens} "
            f"tokens; first difference at {same}){top1}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

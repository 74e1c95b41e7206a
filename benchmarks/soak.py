"""Soak: >= 1,000 short generations on one loaded bundle, resident memory (RSS) every 100 (issue
16).

Not a timed test: it records whether memory creeps. Generations cycle through the shipped prompts
and vary what the loop does (greedy / sampled, drafting / plain / auto, stop strings, streams closed
early), so every path that could leak runs hundreds of times.

    python benchmarks/soak.py /tmp/serve-fp32 --n 1000 --json /tmp/serve-soak.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

from output import emit_json

from dflash_edge.data import read_prompts as load_prompts
from dflash_edge.runtime import Generator

MODES = [  # (temperature, draft, stop, close after the first piece)
    (0.0, "drafter", None, False),
    (0.7, "drafter", None, False),
    (0.0, "none", None, False),
    (0.0, "auto", ["."], False),
    (1.0, "drafter", ["\n"], False),
    (0.0, "drafter", None, True),
]


def rss_mb() -> float:
    """Resident set size of this process now (Linux /proc; psutil elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss / 2**20


def one(gen, prompt: str, i: int, max_new_tokens: int) -> int:
    temperature, draft, stop, close_early = MODES[i % len(MODES)]
    with gen.stream(
        prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=i,
        stop=stop,
        draft=draft,
    ) as stream:
        for _ in stream:
            if close_early:
                break
    return 0 if stream.result is None else stream.result.stats.new_tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--n", type=int, default=1000, help="generations (>= 1000 for the issue's bar)")
    ap.add_argument("--every", type=int, default=100, help="record RSS every K generations")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    prompts = [r["prompt"] for r in load_prompts(None)]
    gen = Generator.load(args.bundle, threads=args.threads)
    samples, tokens, t0 = [], 0, time.perf_counter()
    for i in range(1, args.n + 1):
        tokens += one(gen, prompts[i % len(prompts)], i, args.max_new_tokens)
        if i % args.every == 0:
            gc.collect()
            samples.append(
                {
                    "generations": i,
                    "rss_mb": round(rss_mb(), 1),
                    "gc_objects": len(gc.get_objects()),
                    "elapsed_s": round(time.perf_counter() - t0, 1),
                }
            )
            print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
    first = next(s for s in samples if s["generations"] >= min(100, args.n))
    report = {
        "bundle": str(args.bundle),
        "generations": args.n,
        "new_tokens": tokens,
        "max_new_tokens": args.max_new_tokens,
        "samples": samples,
        "rss_growth_after_first_sample": round(samples[-1]["rss_mb"] / first["rss_mb"] - 1, 4),
        "median_s_per_generation": round(
            statistics.median(b["elapsed_s"] - a["elapsed_s"] for a, b in zip(samples, samples[1:]))
            / args.every,
            3,
        )
        if len(samples) > 1
        else None,
    }
    emit_json(report, args.json, shown={k: v for k, v in report.items() if k != "samples"})
    return 0


if __name__ == "__main__":
    sys.exit(main())

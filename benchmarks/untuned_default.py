"""The default loop with no tuned.json (the README's first `run`) against plain decoding (issue 35).

Per prompt, greedy, `--repeats` interleaved rounds of the arms, their order rotating: plain
(`draft="none"`), default (`draft="auto"`, the bundle's tuned.json ignored) and, with `--before`,
the default loop with the priors it had before issue 35 (a verify row modelled at 0.04 decodes,
probes spaced by back-off alone). Reports per prompt set and per category the median over prompts
of each arm's decode tokens/s over plain's (each arm's median over its rounds), what the default
arm ran, and whether every arm gave the plain tokens.

    python benchmarks/untuned_default.py BUNDLE --sets heldout,quote --max-new-tokens 64 \
        --repeats 1 --before [--limit K] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from output import emit_json

from dflash_edge.data import read_prompts
from dflash_edge.runtime import Generator, policy

# arm -> (draft mode, policy priors while it runs)
ARMS = {
    "plain": ("none", {}),
    "default": ("auto", {}),
    "before": ("auto", {"VERIFY_ROW_PRIOR": 0.04, "PROBE_SHARE": 0.0}),
}


def run_arm(gen, prompt: str, arm: str, max_new_tokens: int):
    draft, priors = ARMS[arm]
    saved = {k: getattr(policy, k) for k in priors}
    for k, v in priors.items():
        setattr(policy, k, v)
    try:
        return gen.generate(prompt, max_new_tokens=max_new_tokens, draft=draft)
    finally:
        for k, v in saved.items():
            setattr(policy, k, v)


def bench_prompt(
    gen, prompt: str, index: int, arms: list[str], max_new_tokens: int, repeats: int
) -> dict:
    """Each arm `repeats` times, the order rotating; each arm's median decode tokens/s / plain's."""
    runs: dict[str, list] = {arm: [] for arm in arms}
    for rnd in range(repeats):
        shift = (index + rnd) % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            runs[arm].append(run_arm(gen, prompt, arm, max_new_tokens))
    tps = {
        arm: statistics.median(r.stats.decode_tokens_per_s for r in rs) for arm, rs in runs.items()
    }
    s = runs["default"][0].stats
    return {
        **{f"{arm}_ratio": round(tps[arm] / tps["plain"], 3) for arm in arms if arm != "plain"},
        "lossless": all(
            r.token_ids == runs["plain"][0].token_ids for rs in runs.values() for r in rs
        ),
        "plain_tokens_per_s": round(tps["plain"], 2),
        "new_tokens": s.new_tokens,
        "steps_drafter_lookup_plain": [
            len(s.acceptance_lengths),
            len(s.lookup_lengths),
            s.plain_steps,
        ],
        "probes": s.probe_steps,
        "lookup_tokens": sum(s.lookup_lengths),
    }


def run_set(gen, name: str, arms: list[str], args) -> dict:
    """One prompt set: per-prompt rows, then medians per category and over the set."""
    rows = []
    for i, row in enumerate(read_prompts(name, args.limit)):
        ratios = bench_prompt(gen, row["prompt"], i, arms, args.max_new_tokens, args.repeats)
        out = {"category": row.get("category", ""), **ratios}
        rows.append(out)
        print(name, i, json.dumps(out), file=sys.stderr, flush=True)
    cats = {
        cat: _summary([r for r in rows if r["category"] == cat], arms)
        for cat in dict.fromkeys(r["category"] for r in rows)
    }
    return {**_summary(rows, arms), "by_category": cats, "rows": rows}


def _summary(rows: list[dict], arms: list[str]) -> dict:
    medians = {
        f"{arm}_ratio": round(statistics.median(r[f"{arm}_ratio"] for r in rows), 3)
        for arm in arms
        if arm != "plain"
    }
    steps = [sum(r["steps_drafter_lookup_plain"][i] for r in rows) for i in range(3)]
    return {
        "prompts": len(rows),
        **medians,
        "lossless": all(r["lossless"] for r in rows),
        "steps_drafter_lookup_plain": steps,
        "probes": sum(r["probes"] for r in rows),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--sets", default="heldout,quote", help="shipped prompt sets, comma-separated")
    p.add_argument("--limit", type=int, default=0, help="the first K prompts of each set (0: all)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds per prompt")
    p.add_argument("--before", action="store_true", help="also an arm with the pre-issue-35 priors")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", help="also write the full report here")
    args = p.parse_args(argv)
    gen = Generator.load(args.bundle, verify=False, use_tuned=False, threads=args.threads)
    gen.generate("Hello", max_new_tokens=8)  # warm the sessions
    arms = ["plain", "default"] + (["before"] if args.before else [])
    report = {
        "bundle": args.bundle,
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "sets": {name: run_set(gen, name, arms, args) for name in args.sets.split(",")},
    }
    brief = {
        name: {k: v for k, v in s.items() if k != "rows"} for name, s in report["sets"].items()
    }
    emit_json(report, args.json, shown=brief)
    return 0 if all(s["lossless"] for s in report["sets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

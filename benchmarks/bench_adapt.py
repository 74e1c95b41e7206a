"""Is the tuned verify length right? Oracle drafters of several hit rates: tuned k vs every fixed k.

Issue 13. For each hit rate h the bundle's drafter is wrapped by tests/oracle_drafter.py's
`OracleDrafter` (each draft token replaced by the target's true next token with probability h),
then:
  1. tune: `calibrate.step_times` + `calibrate.acceptance` on the prompts, `choose_verify_len`
     -> tuned k
  2. per prompt, interleaved (order rotating): plain decoding, always-draft with each fixed k, and
     the default arm (adaptive policy seeded by that tuned result)
and reports the median speedup over plain of each, the best fixed k, and tuned / best.

    python benchmarks/bench_adapt.py BUNDLE --hits 0.5,0.8,0.95 --ks 1,2,3,5,7,10,15 --limit 3 \
        --max-new-tokens 64 --tune-budget 40 [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from output import emit_json  # noqa: E402

from oracle_drafter import OracleDrafter  # noqa: E402  (the tests' oracle drafter: one implementation)


def sweep_hit(
    gen,
    real,
    prompts: list[str],
    hit: float,
    ks: list[int],
    max_new_tokens: int,
    tune_budget: float,
    step_ms: dict,
    repeats: int = 1,
) -> dict:
    from dflash_edge.runtime.calibrate import acceptance
    from dflash_edge.runtime.tuning import (
        Tuned,
        choose_verify_len,
        manifest_digest,
        monotone,
        survival,
    )

    gen.drafter, gen.tuned = real, None
    plain = {
        p: gen.generate(p, max_new_tokens=max_new_tokens, draft="none").token_ids for p in prompts
    }

    def install(i, p):
        gen.drafter = OracleDrafter(real, gen.encode(p) + plain[p], hit, seed=i)

    accepted, deadline = (
        [],
        time.perf_counter() + tune_budget,
    )  # 1. tune (step times measured once, outside)
    for i, p in enumerate(prompts):
        install(i, p)
        accepted += acceptance(gen, [p], max_new_tokens, deadline)[0]
    drafts = gen.block_size - 1
    target_ms = monotone([step_ms[k] for k in range(drafts + 1)])
    verify_ms = {k: target_ms[k] for k in range(1, drafts + 1)}
    s = survival(accepted, drafts)
    k_tuned, rates = choose_verify_len(target_ms[0], step_ms["draft"], verify_ms, s)
    gen.tuned = Tuned(
        k_tuned, target_ms[0], step_ms["draft"], verify_ms, s, manifest_digest(gen.bundle.manifest)
    )

    fixed = sorted(set(ks) | ({k_tuned} if k_tuned else set()))  # the tuned k is always among them
    arms = (
        [("plain", "none", None)]
        + [(f"k{k}", "drafter", k) for k in fixed]
        + [("default", "auto", None)]
    )
    speed: dict[str, list[float]] = {name: [] for name, _, _ in arms}
    for i, p in enumerate(prompts):  # 2. interleaved arms, order rotating
        res: dict[str, list[float]] = {name: [] for name, _, _ in arms}
        for rep in range(repeats):
            shift = (i + rep) % len(arms)
            for name, use, k in arms[shift:] + arms[:shift]:
                install(i, p)  # every arm sees the same oracle draws
                r = gen.generate(p, max_new_tokens=max_new_tokens, draft=use, verify_len=k)
                assert r.token_ids == plain[p], (name, p)  # lossless, every arm
                res[name].append(r.stats.decode_tokens_per_s)
        for name in res:  # median tok/s of the repeats, then the ratio
            speed[name].append(statistics.median(res[name]) / statistics.median(res["plain"]))
    med = {name: round(statistics.median(v), 3) for name, v in speed.items()}
    best = max((n for n in med if n.startswith("k")), key=med.get)
    return {
        "hit": hit,
        "tau_full_block": round(1 + sum(s), 3),
        "tuned_k": k_tuned,
        "predicted_tokens_per_s": {k: round(v, 2) for k, v in rates.items()},
        "speedup": med,
        "best_fixed": best,
        "best_fixed_speedup": med[best],
        "default_over_best": round(med["default"] / med[best], 3),
        "tuned_k_over_best": round(med[f"k{k_tuned}"] / med[best], 3)
        if f"k{k_tuned}" in med
        else None,
    }


def main(argv=None) -> int:
    from dflash_edge.data import read_prompts as load_prompts
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.calibrate import step_times

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--hits", default="0.5,0.8,0.95")
    p.add_argument("--ks", default="1,2,3,5,7,10,15", help="fixed verify lengths to compare")
    p.add_argument("--prompts", default=None)
    p.add_argument("--limit", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--tune-budget",
        type=float,
        default=40.0,
        help="seconds of acceptance calibration per hit rate",
    )
    p.add_argument(
        "--time-budget", type=float, default=40.0, help="seconds timing the step sizes (once)"
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="runs of every arm per prompt (median tok/s)"
    )
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args(argv)
    gen = Generator.load(args.bundle, verify=False, use_tuned=False)
    real = gen.drafter
    prompts = [r["prompt"] for r in load_prompts(args.prompts, args.limit)]
    gen.generate("Hello", max_new_tokens=8)
    step_ms, ctx = step_times(gen, 256, args.time_budget)
    ks = [int(k) for k in args.ks.split(",")]
    out = {
        "bundle": args.bundle,
        "block_size": gen.block_size,
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "step_ms": step_ms,
        "context": ctx,
        "by_hit": [
            sweep_hit(
                gen,
                real,
                prompts,
                float(h),
                ks,
                args.max_new_tokens,
                args.tune_budget,
                step_ms,
                args.repeats,
            )
            for h in args.hits.split(",")
        ],
    }
    emit_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

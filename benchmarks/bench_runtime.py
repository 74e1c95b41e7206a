"""Step-time micro-benchmark of a bundle through the runtime's own bound steps (no generation loop).

Times, interleaved round-robin so machine noise hits all alike (medians reported):
  decode   target T=1 at a context of --context positions (the autoregressive step)
  verify   target T=B at the same context (one speculative verify)
  draft    drafter with C=B new context rows (one speculative draft)
  prefill  target T=P (one prompt chunk)
and the ratios verify/decode and (draft+verify)/decode: the acceptance length a drafter must beat
for speculation to pay off.

With `--oracle-hits 0.5,0.8,1.0` it instead runs the real loop with an *oracle* drafter (the real
drafter runs, then each draft token is replaced by the target's true next token with probability
`hit`) and reports speedup vs acceptance length: what a trained drafter of that quality would give
on this machine.

    python benchmarks/bench_runtime.py BUNDLE [--context 256] [--repeats 20] [--threads 0] \\
        [--json OUT]
    python benchmarks/bench_runtime.py BUNDLE --oracle-hits 0.6,0.8,0.9,1.0 [--limit 8] \\
        [--max-new-tokens 96]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from output import emit_json  # noqa: E402
from timing import round_robin_ms  # noqa: E402

from oracle_drafter import OracleDrafter  # noqa: E402  (the tests' oracle drafter: one implementation)


def measure(
    bundle: str,
    context: int,
    repeats: int,
    threads: int,
    spin: bool = False,
    extra_sizes: tuple[int, ...] = (),
) -> dict:
    from dflash_edge.runtime import Generator

    gen = Generator.load(bundle, threads=threads, spin=spin, verify=False)
    tgt, drf, block, chunk = gen.target, gen.drafter, gen.block_size, gen.prefill_chunk
    for t in extra_sizes:  # other verify sizes (the graph's T is dynamic)
        tgt.step(t)
    context = min(context, gen.max_context - chunk)
    ids = [(7 * i) % 1000 + 10 for i in range(context)]
    gen._prefill(ids, gen_sampling(), reuse=False)  # fills the caches with a real prefix
    drf.kv.pos = context - block  # the drafter has all but one block of context

    def decode():
        tgt.forward(1, context)

    def verify():
        tgt.forward(block, context)

    def draft():
        drf.kv.pos = context - block
        drf.draft(ids[-1], context)

    def prefill():
        tgt.forward(chunk, context)

    cases = {"decode": decode, "verify": verify, "draft": draft, "prefill": prefill}
    for t in extra_sizes:
        cases[f"target_T{t}"] = lambda t=t: tgt.forward(t, context)
    med = round_robin_ms(cases, repeats)
    return {
        "bundle": bundle,
        "target_graph": tgt.GRAPH,
        "context": context,
        "block_size": block,
        "prefill_chunk": chunk,
        "repeats": repeats,
        "threads": threads,
        "spin": spin,
        "median_ms": {k: round(v, 2) for k, v in med.items()},
        "verify_over_decode": round(med["verify"] / med["decode"], 3),
        "draft_plus_verify_over_decode": round((med["verify"] + med["draft"]) / med["decode"], 3),
    }


def oracle_sweep(
    bundle: str, hits: list[float], limit: int, max_new_tokens: int, threads: int
) -> dict:
    from dflash_edge.data import read_prompts as load_prompts
    from dflash_edge.runtime import Generator

    gen = Generator.load(bundle, threads=threads, verify=False)
    real = gen.drafter
    gen.generate("Hello", max_new_tokens=8)
    rows = []
    for i, row in enumerate(load_prompts(None, limit)):
        for hit in hits:
            gen.drafter = real
            ar = gen.generate(row["prompt"], max_new_tokens=max_new_tokens, draft="none")
            gen.drafter = OracleDrafter(real, gen.encode(row["prompt"]) + ar.token_ids, hit, seed=i)
            spec = gen.generate(row["prompt"], max_new_tokens=max_new_tokens, draft="drafter")
            assert spec.token_ids == ar.token_ids, row["id"]
            rows.append(
                {
                    "id": row["id"],
                    "hit": hit,
                    "tau": spec.stats.mean_acceptance_length,
                    "speedup": spec.stats.decode_tokens_per_s / ar.stats.decode_tokens_per_s,
                    "spec_step_ms": spec.stats.step_ms,
                    "ar_step_ms": ar.stats.step_ms,
                    "overhead": spec.stats.python_overhead,
                }
            )
    gen.drafter = real
    summary = {}
    for hit in hits:
        sel = [r for r in rows if r["hit"] == hit]
        summary[str(hit)] = {
            k: round(statistics.median(r[k] for r in sel), 3)
            for k in ("tau", "speedup", "spec_step_ms", "ar_step_ms", "overhead")
        }
    return {
        "bundle": bundle,
        "block_size": gen.block_size,
        "prompts": limit,
        "max_new_tokens": max_new_tokens,
        "median_by_hit": summary,
        "rows": rows,
    }


def gen_sampling():
    from dflash_edge.runtime.sampling import SamplingParams

    return SamplingParams()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument(
        "--context", type=int, default=256, help="cached positions before the timed step"
    )
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument(
        "--threads", type=int, default=0, help="intra-op threads (0: one per usable CPU)"
    )
    p.add_argument("--spin", action="store_true", help="intra-op threads busy-wait between ops")
    p.add_argument("--sizes", default="", help="extra target step sizes T to time, e.g. 4,8")
    p.add_argument(
        "--oracle-hits", default="", help="oracle-drafter sweep instead, e.g. 0.6,0.8,1.0"
    )
    p.add_argument("--limit", type=int, default=8, help="prompts for the oracle sweep")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args(argv)
    if args.oracle_hits:
        hits = [float(h) for h in args.oracle_hits.split(",")]
        out = oracle_sweep(args.bundle, hits, args.limit, args.max_new_tokens, args.threads)
        shown = out["median_by_hit"]
    else:
        shown = out = measure(
            args.bundle,
            args.context,
            args.repeats,
            args.threads,
            args.spin,
            tuple(int(t) for t in args.sizes.split(",") if t),
        )
    emit_json(out, args.json, shown=shown)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Step-time micro-benchmark of a bundle through the runtime's own bound steps (no generation loop).

Times, interleaved round-robin so machine noise hits all alike (medians reported):
  decode   target T=1 at a context of --context positions (the autoregressive step)
  verify   target T=B at the same context (one speculative verify)
  draft    drafter with C=B new context rows (one speculative draft)
  prefill  target T=P (one prompt chunk)
and the ratios verify/decode and (draft+verify)/decode: the acceptance length a drafter must beat
for speculation to pay off.

    python benchmarks/bench_runtime.py BUNDLE [--context 256] [--repeats 20] [--threads 0] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def measure(bundle: str, context: int, repeats: int, threads: int, spin: bool = False) -> dict:
    from dflash_edge.runtime import Generator

    gen = Generator.load(bundle, threads=threads, spin=spin, verify=False)
    tgt, drf, block, chunk = gen.target, gen.drafter, gen.block_size, gen.prefill_chunk
    context = min(context, gen.max_context - chunk)
    ids = [(7 * i) % 1000 + 10 for i in range(context)]
    gen._prefill(ids, gen_sampling())                      # fills the caches with a real prefix
    drf.kv.pos = context - block                           # the drafter has all but one block of context

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
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(2):                                     # warm-up
        for fn in cases.values():
            fn()
    for _ in range(repeats):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    return {"bundle": bundle, "context": context, "block_size": block, "prefill_chunk": chunk, "repeats": repeats,
            "threads": threads, "spin": spin, "median_ms": {k: round(v, 2) for k, v in med.items()},
            "verify_over_decode": round(med["verify"] / med["decode"], 3),
            "draft_plus_verify_over_decode": round((med["verify"] + med["draft"]) / med["decode"], 3)}


def gen_sampling():
    from dflash_edge.runtime.sampling import SamplingParams

    return SamplingParams()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("--context", type=int, default=256, help="cached positions before the timed step")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: one per usable CPU)")
    p.add_argument("--spin", action="store_true", help="intra-op threads busy-wait between ops")
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args(argv)
    out = measure(args.bundle, args.context, args.repeats, args.threads, args.spin)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

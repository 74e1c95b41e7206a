"""Decode cost vs context, portable target vs fused target (issue 12), side by side in one run.

Loads the bundle twice (`target_graph="target"` and `"target_fused"`), fills both caches with the
same prefix of `max(--contexts)` positions, then times single steps at each context, interleaved
round-robin so machine noise hits every case alike; medians reported, plus each context's ratio to
the smallest one. One extra case, `fused_copy`, runs the fused graph with `present_*` bound to a
SECOND buffer instead of the past one: onnxruntime must then copy the prefix, which shows what
sharing the buffer saves. `--also LABEL=BUNDLE` (repeatable) adds another bundle's fused target to
the same round-robin, e.g. the same model with an int8 KV cache (`quantize --kv-cache int8`).

    python benchmarks/bench_fused.py BUNDLE [--contexts 64,1024,1800] [--repeats 15] [--threads 0]
                                           [--verify] [--also LABEL=BUNDLE ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys

from output import emit_json
from timing import round_robin_ms


def _filled(bundle: str, graph: str, threads: int, prefix: list[int]):
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.sampling import SamplingParams

    gen = Generator.load(bundle, threads=threads, verify=False, target_graph=graph)
    gen._prefill(prefix, SamplingParams(), reuse=False)  # a real prefix in the cache
    return gen


def _unshared_step(gen):
    """A fused T=1 step whose present outputs go to a second buffer (the copying path)."""
    from dflash_edge.runtime.kv import HostStep, KVShape, LayerKV

    tgt, d = gen.target, gen.target.dims
    other = LayerKV(tgt.kv.capacity, KVShape(d["L"], d["Hkv"], d["D"]), tgt.kv.key.dtype)
    step = HostStep(tgt.runner, "target_fused", {**d, "T": 1, "R": 1}, tgt.HOST)
    for i in range(d["L"]):
        for kind, past, present in (
            ("key", tgt.kv.key, other.key),
            ("value", tgt.kv.value, other.value),
        ):
            past.bind_input(step.binding, f"past_{kind}.{i}", i, i + 1)
            present.bind_output(step.binding, f"present_{kind}.{i}", i, i + 1)

    def run(start: int) -> None:
        step["seqlens_k"][0], step["total_sequence_length"][...] = start, start + 1
        tgt.hidden.bind_output(step.binding, "hidden", start, start + 1)
        tgt.runner.run(step.binding)

    return run, other


def measure(
    bundle: str,
    contexts: list[int],
    repeats: int,
    threads: int,
    verify: bool,
    also: dict[str, str] | None = None,
) -> dict:
    longest = max(contexts)
    prefix = [(7 * i) % 1000 + 10 for i in range(longest)]
    gens = {
        "portable": _filled(bundle, "target", threads, prefix),
        "fused": _filled(bundle, "target_fused", threads, prefix),
    }
    for label, other in (also or {}).items():
        gens[f"fused[{label}]"] = _filled(other, "target_fused", threads, prefix)
    block = gens["fused"].block_size
    unshared, _keep = _unshared_step(gens["fused"])
    cases = {}
    for ctx in contexts:
        for flavour, gen in gens.items():
            cases[f"{flavour}_decode@{ctx}"] = lambda g=gen, c=ctx: g.target.forward(1, c)
            if verify:
                cases[f"{flavour}_verify@{ctx}"] = lambda g=gen, c=ctx: g.target.forward(block, c)
        cases[f"fused_copy_decode@{ctx}"] = lambda c=ctx: unshared(c)
    med = {k: round(v, 2) for k, v in round_robin_ms(cases, repeats).items()}
    base = min(contexts)
    ratios = {k: round(v / med[k.split("@")[0] + f"@{base}"], 3) for k, v in med.items()}
    return {
        "bundle": bundle,
        "also": also or {},
        "contexts": contexts,
        "repeats": repeats,
        "threads": threads,
        "median_ms": med,
        f"ratio_vs_{base}": ratios,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument(
        "--contexts", default="64,1024,1800", help="cached positions before each timed step"
    )
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--verify", action="store_true", help="also time verify steps (T = block size)")
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="LABEL=BUNDLE",
        help="also time this bundle's fused target (repeatable)",
    )
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args(argv)
    also = dict(a.split("=", 1) for a in args.also)
    out = measure(
        args.bundle,
        [int(c) for c in args.contexts.split(",")],
        args.repeats,
        args.threads,
        args.verify,
        also,
    )
    emit_json(out, args.json, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

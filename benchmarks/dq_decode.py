"""Low-bit weights as DequantizeLinear vs onnxruntime's contrib ops (issue 39): bytes on disk, and
target decode / verify ms per step of each bundle's portable and fused targets, interleaved.

Each bundle is loaded once per target graph (`target`, `target_fused`), its cache filled with the
same prefix, then single steps at `--context` cached positions are timed round-robin across every
(bundle, graph) so machine noise hits all alike; medians reported.

    python benchmarks/dq_decode.py standard=/tmp/dq/b_standard contrib=/tmp/dq/b_contrib \\
        [--context 64] [--repeats 30] [--threads 2] [--json OUT]
    python benchmarks/dq_decode.py --rss BUNDLE   # peak / final RSS of the CPU runtime (one process
                                                  # per bundle: VmHWM only grows)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench_fused import _filled
from output import emit_json
from timing import round_robin_ms


def bundle_bytes(path: str) -> dict:
    """Bytes on disk: every weights file, and the whole folder."""
    root = Path(path)
    files = {p.name: p.stat().st_size for p in sorted(root.iterdir()) if p.is_file()}
    data = sum(v for k, v in files.items() if k.endswith(".data"))
    return {"weights_files": data, "folder": sum(files.values())}


def measure(bundles: dict[str, str], context: int, repeats: int, threads: int) -> dict:
    prefix = [(7 * i) % 1000 + 10 for i in range(context)]
    gens = {
        f"{label}:{graph}": _filled(path, graph, threads, prefix)
        for label, path in bundles.items()
        for graph in ("target", "target_fused")
    }
    block = next(iter(gens.values())).block_size
    cases = {}
    for name, gen in gens.items():
        cases[f"{name}_decode"] = lambda g=gen: g.target.forward(1, context)
        cases[f"{name}_verify{block}"] = lambda g=gen: g.target.forward(block, context)
    med = {k: round(v, 2) for k, v in round_robin_ms(cases, repeats).items()}
    return {
        "bundles": bundles,
        "bytes": {label: bundle_bytes(path) for label, path in bundles.items()},
        "context": context,
        "repeats": repeats,
        "threads": threads,
        "median_ms": med,
    }


def rss(bundle: str, threads: int) -> dict:
    """VmHWM / VmRSS (MB) after `Generator.load` (fused target + drafter, as `run` does) and 32
    greedy tokens with the drafter."""
    from dflash_edge.runtime import Generator

    def vm(key: str) -> int:
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith(key))
        return int(line.split()[1]) * 1024 // 10**6

    gen = Generator.load(bundle, threads=threads, use_tuned=False)
    loaded = {"hwm_mb": vm("VmHWM"), "rss_mb": vm("VmRSS")}
    gen.generate_ids([(7 * i) % 1000 + 10 for i in range(40)], 32, draft="drafter")
    return {
        "bundle": bundle,
        "after_load": loaded,
        "after_32_tokens": {"hwm_mb": vm("VmHWM"), "rss_mb": vm("VmRSS")},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundles", nargs="+", metavar="LABEL=BUNDLE")
    p.add_argument("--rss", action="store_true", help="memory of the CPU runtime on one bundle")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args(argv)
    if args.rss:
        print(json.dumps(rss(args.bundles[0], args.threads), indent=1))
        return 0
    out = measure(
        dict(b.split("=", 1) for b in args.bundles), args.context, args.repeats, args.threads
    )
    emit_json(out, args.json, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

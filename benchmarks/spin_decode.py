"""Plain decode ms/token with intra-op spinning on (the default; it stops when a run returns) and
off, per flavour.

    python benchmarks/spin_decode.py BUNDLE [--rounds 3]

Each (flavour, spin) pair is a separately loaded Generator; rounds interleave them; medians are
printed."""

from __future__ import annotations

import argparse
import statistics


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args()
    from dflash_edge.runtime import Generator
    from dflash_edge.runtime.bundle import read_bundle

    graphs = [
        g for g in ("target_fused", "target") if g in read_bundle(args.bundle).manifest["graphs"]
    ]
    gens = {
        (g, spin): Generator.load(args.bundle, threads=args.threads, spin=spin, target_graph=g)
        for g in graphs
        for spin in (False, True)
    }
    ms: dict = {}
    for _ in range(args.rounds):
        for key, gen in gens.items():
            ids = gen.encode("Write a short story about a robot learning to paint.")
            res = gen.generate_ids(ids, args.tokens, draft="none", stop_token_ids=())
            ms.setdefault(key, []).append(1000 / res.stats.decode_tokens_per_s)
    for (graph, spin), vals in ms.items():
        print(f"{graph:13s} spin={spin!s:5s} {statistics.median(vals):7.2f} ms/token")


if __name__ == "__main__":
    main()

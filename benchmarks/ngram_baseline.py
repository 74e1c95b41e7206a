"""How far a drafter is from an n-gram table: per-position accuracy of count-based predictors.

A block position k predicts the token k after the anchor. The baseline predicts it from the anchor
token alone (the most frequent follower at distance k in the training responses), and also from the
anchor plus the token before it. A trained DFlash drafter that does not beat these is not yet using
the target's features. Reads a `dflash-edge train` work directory (response and held-out shards).

    python benchmarks/ngram_baseline.py /path/to/work-dir [--max-shards 22] [--positions 3]
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path


def table(samples, k: int, context: int):
    """Most frequent token k after each (context)-token key, over the response parts of
    `samples`."""
    counts = defaultdict(Counter)
    for s in samples:
        t, p = s.tokens.tolist(), s.prompt_len
        for i in range(max(p, context - 1), len(t) - k):
            counts[tuple(t[i - context + 1 : i + 1])][t[i + k]] += 1
    return {key: c.most_common(1)[0][0] for key, c in counts.items()}


def accuracy(best: dict, samples, k: int, context: int) -> float:
    hit = n = 0
    for s in samples:
        t, p = s.tokens.tolist(), s.prompt_len
        for i in range(max(p, context - 1), len(t) - k):
            n += 1
            hit += best.get(tuple(t[i - context + 1 : i + 1])) == t[i + k]
    return hit / max(n, 1)


def replayed_tau(tables: list[dict], held, context: int, budget: int = 128) -> float:
    """Mean acceptance length of the n-gram drafter (block = 1 + len(tables)), greedy, replayed."""
    from dflash_edge.train.objective import simulated_tau

    steps = []
    for s in held:
        t, p = s.tokens.tolist(), s.prompt_len
        accept_at = []
        for a in range(p, len(t) - 1):
            key, n = tuple(t[a - context + 1 : a + 1]), 0
            for k, best in enumerate(tables, start=1):
                if a + k >= len(t) or best.get(key) != t[a + k]:
                    break
                n += 1
            accept_at.append(n)
        steps += simulated_tau(accept_at, p, len(t) - 1, budget)
    return sum(steps) / max(len(steps), 1)


def main() -> None:
    from dflash_edge.train.recipe import load_samples

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work_dir")
    ap.add_argument("--max-shards", type=int, default=0)
    ap.add_argument("--positions", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=16)
    a = ap.parse_args()
    train = load_samples(Path(a.work_dir) / "responses", a.max_shards)
    held = load_samples(Path(a.work_dir) / "heldout")
    print(f"{len(train)} training responses, {len(held)} held-out responses")
    for context in (1, 2):
        tables = [table(train, k, context) for k in range(1, a.block_size)]
        accs = [accuracy(tables[k - 1], held, k, context) for k in range(1, a.positions + 1)]
        print(
            f"{context}-token key: accuracy at k=1..{a.positions}: "
            + " ".join(f"{x:.3f}" for x in accs)
            + f"; replayed tau at block {a.block_size}: {replayed_tau(tables, held, context):.3f}"
        )


if __name__ == "__main__":
    main()

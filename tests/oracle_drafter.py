"""The oracle drafter: proposes the target's own future tokens, to drive acceptance paths on
purpose.

One implementation for the tests (conftest.py's `oracle` fixture, over the runtime and over the
torch reference loop) and the benchmarks (bench_runtime.py and bench_adapt.py put tests/ on sys.path
for it). A helper, not a test module: pytest collects nothing here (not named test_*)."""

from __future__ import annotations

import numpy as np


def oracle_ids(ids, full_sequence, first: int, hit: float, rng, miss=None):
    """Overwrite drafts in place and return them: ids[k-1] proposes position first + k (k =
    1..len(ids)).

    Each position the true continuation `full_sequence` reaches becomes its true token with
    probability `hit`; otherwise the draft stays as drafted, or becomes `miss(true)` (a sure miss)
    when `miss` is given. Beyond the end of `full_sequence` drafts stay as drafted. One
    `rng.random()` per reached position."""
    for k in range(1, len(ids) + 1):
        if first + k < len(full_sequence):
            true = full_sequence[first + k]
            if rng.random() < hit:
                ids[k - 1] = true
            elif miss is not None:
                ids[k - 1] = miss(true)
    return ids


class OracleDrafter:
    """Wraps the runtime's drafter (everything passes through); its drafts pass through
    `oracle_ids`.

    The real drafter still runs each step, so its caches and timings stay those of a real run.
    """

    def __init__(self, real, full_sequence, hit: float, seed: int = 0, miss=None):
        self.real, self.full, self.hit, self.miss = real, list(full_sequence), hit, miss
        self.rng = np.random.default_rng(seed)

    def __getattr__(self, name):
        return getattr(self.real, name)

    def draft(self, last_token, ctx_end):
        ids = self.real.draft(last_token, ctx_end).copy()  # ctx_end is the position of last_token
        return oracle_ids(ids, self.full, ctx_end, self.hit, self.rng, self.miss)

"""Round-robin timing shared by the step benchmarks: every case once per round, so machine noise
hits all alike."""

from __future__ import annotations

import statistics
import time


def round_robin_ms(cases: dict, repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median milliseconds per call of each `cases[name]()`, over `repeats` interleaved rounds after
    `warmup`."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}

"""Timing shared by the step benchmarks: medians of repeated calls, and a round robin (every case
once per round, so machine noise hits all alike)."""

from __future__ import annotations

import argparse
import statistics
import time


def median_ms(fn, repeats: int, skip: int = 0) -> float:
    """Median milliseconds per call of `fn()` over `repeats` calls, the first `skip` left out."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times[skip:])


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


if __name__ == "__main__":
    argparse.ArgumentParser(
        description=f"{__doc__} Imported by the benchmarks; nothing to run."
    ).parse_args()

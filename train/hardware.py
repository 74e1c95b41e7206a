"""Which float type this CPU multiplies fastest: bf16 wins only with AMX / AVX512-BF16.

On an AVX2-only CPU torch's bf16 matmul is ~50x slower than fp32 (1 vs 60 GFLOPS measured on a
2-core EPYC); on a Sapphire Rapids it is ~3x faster. A 20 ms probe decides instead of a CPU-flag table.
"""
from __future__ import annotations

import functools
import time


@functools.cache
def fast_bf16() -> bool:
    """True when a bf16 matmul runs faster than the same fp32 one here."""
    import torch

    a, b = torch.randn(64, 256), torch.randn(256, 256)

    def best(x, y) -> float:
        x @ y  # warm-up
        times = []
        for _ in range(3):
            t = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - t)
        return min(times)

    return best(a.bfloat16(), b.bfloat16()) < best(a, b)


def resolve_dtype(name: str) -> str:
    """'auto' -> 'bfloat16' where it is faster, else 'float32'; other names pass through."""
    if name != "auto":
        return name
    return "bfloat16" if fast_bf16() else "float32"

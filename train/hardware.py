"""Which float type this CPU multiplies fastest (bf16 wins only with AMX / AVX512-BF16), and the
device.

On an AVX2-only CPU torch's bf16 matmul is ~50x slower than fp32 (1 vs 60 GFLOPS measured on a
2-core EPYC); on a Sapphire Rapids it is ~3x faster. A 20 ms probe decides instead of a CPU-flag
table."""

from __future__ import annotations

import functools
import time

from ..runtime.errors import DflashEdgeError


class DeviceError(DflashEdgeError, ValueError):
    """A training device that does not exist or that this torch cannot use."""


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


def resolve_dtype(name: str, device: str = "cpu") -> str:
    """'auto' -> 'bfloat16' where it is faster (always on a GPU), else 'float32'; other names pass
    through."""
    if name != "auto":
        return name
    return "bfloat16" if not str(device).startswith("cpu") or fast_bf16() else "float32"


def resolve_device(name: str) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'; 'cuda' without a GPU is a clear error."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(
            f"--device {name}: this torch ({torch.__version__}) sees no CUDA GPU; "
            "use --device cpu (or auto), or install a CUDA build of torch"
        )
    if name != "cpu" and not name.startswith("cuda"):
        raise DeviceError(f"unknown device {name!r}; choose cpu, cuda, cuda:N or auto")
    return name

"""Resident memory per export stage, and the check that a checkpoint fits before any work starts.

`MemoryMeter` records the process's peak RSS at the end of each stage; the figures go to the
manifest's `source.peak_rss_mb` and are printed.

>>> meter = MemoryMeter()
>>> with meter.stage("load"):
...     pass
>>> meter.peaks["load"] > 0
True
"""
from __future__ import annotations

import os
from contextlib import contextmanager

from dflash_edge.runtime.errors import DflashEdgeError

# Fitted to two measured torch-path exports (docs/BENCHMARKS.md, issue 15): peak RSS ~ 1.9 x the target's
# fp32 bytes + 2.0 GB (SmolLM2-135M: 0.54 GB -> 3.0 GB; Qwen3-0.6B dims: 2.39 GB -> 6.5 GB).
EXPORT_PEAK_PER_WEIGHT_BYTE = 1.9
EXPORT_PEAK_FIXED_BYTES = 2.0e9


class InsufficientMemoryError(DflashEdgeError):
    """The export would need more memory than this machine has available."""


def rss_bytes() -> int:
    """This process's resident set size now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def check_fits(weight_bytes: int, what: str) -> float:
    """Raise InsufficientMemoryError before starting when the estimated peak exceeds what is available.

    Returns the estimate in bytes.
    """
    need = EXPORT_PEAK_PER_WEIGHT_BYTE * weight_bytes + EXPORT_PEAK_FIXED_BYTES
    have = available_bytes()
    if have is not None and need > have + rss_bytes():
        raise InsufficientMemoryError(
            f"exporting {what} needs about {need / 1e9:.1f} GB of memory (estimate: {EXPORT_PEAK_PER_WEIGHT_BYTE:g} x "
            f"its {weight_bytes / 1e9:.2f} GB of fp32 weights + {EXPORT_PEAK_FIXED_BYTES / 1e9:g} GB) but "
            f"{have / 1e9:.1f} GB is available; free memory, use a machine with more, or pass --no-memory-check "
            f"to try anyway")
    return need


class MemoryMeter:
    """The process's peak RSS (the kernel's VmHWM) at the end of each named stage.

    The figure is the peak so far, so a stage's own peak is its figure when that rose during it (a
    sampling thread would miss peaks while native code holds the GIL, e.g. inside torch's exporter).
    Between stages, memory glibc keeps after large frees is handed back (`malloc_trim`).
    """

    def __init__(self):
        self.peaks: dict[str, int] = {}
        self.after: dict[str, int] = {}        # RSS once the stage's garbage is freed (what the next stage starts from)

    @contextmanager
    def stage(self, name: str):
        try:
            yield
        finally:
            self.peaks[name] = peak_rss_bytes()
            release_free_memory()
            self.after[name] = rss_bytes()

    def report_mb(self) -> dict[str, int]:
        return {k: round(v / 1e6) for k, v in self.peaks.items()}

    def after_mb(self) -> dict[str, int]:
        return {k: round(v / 1e6) for k, v in self.after.items()}


def peak_rss_bytes() -> int:
    """VmHWM from /proc/self/status (Linux), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def release_free_memory() -> None:
    """Return freed heap pages to the OS (glibc keeps them after large frees); a no-op elsewhere."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass

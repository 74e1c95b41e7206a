"""Resident memory of this process: now, its peak, and the peak at the end of each named stage.

Lives in runtime/ (floor 2) so both export/ and quantize/ (floor 4) meter their stages with it; the
figures go to the manifest's `source` section and are printed.

>>> meter = MemoryMeter()
>>> with meter.stage("load"):
...     pass
>>> meter.peaks["load"] > 0
True
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource
import sys
from contextlib import contextmanager


def rss_bytes() -> int:
    """This process's resident set size now (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def proc_kb_field(path: str, key: str) -> int | None:
    """Bytes of the `key:` line of a Linux /proc file given in kB (e.g. VmHWM, MemAvailable); None
    elsewhere."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (None where unknown)."""
    return proc_kb_field("/proc/meminfo", "MemAvailable")


def peak_rss_bytes() -> int:
    """VmHWM from /proc/self/status (Linux), else ru_maxrss (bytes on macOS, KiB elsewhere)."""
    peak = proc_kb_field("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (
        1 if sys.platform == "darwin" else 1024
    )


def release_free_memory() -> None:
    """Return freed heap pages to the OS (glibc keeps them after large frees); a no-op elsewhere."""

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class MemoryMeter:
    """The process's peak RSS (the kernel's VmHWM) at the end of each named stage.

    The figure is the peak so far, so a stage's own peak is its figure when that rose during it (a
    sampling thread would miss peaks while native code holds the GIL). Between stages, memory glibc
    keeps after large frees is handed back (`malloc_trim`).
    """

    def __init__(self):
        self.peaks: dict[str, int] = {}
        # RSS once the stage's garbage is freed (what the next stage starts from)
        self.after: dict[str, int] = {}

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

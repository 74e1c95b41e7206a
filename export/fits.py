"""The check that a checkpoint fits in memory before any export work starts.

The per-stage meter (`MemoryMeter`: peak RSS at the end of each stage, into the manifest's
`source.peak_rss_mb`) is runtime/memory.py's, shared with quantize/.

On a machine with less than 3.1 GB available:

>>> check_fits(2_400_000_000, "Qwen3-0.6B")      # doctest: +SKIP
InsufficientMemoryError: exporting Qwen3-0.6B needs about 3.1 GB of memory ...
"""

from __future__ import annotations

from ..runtime.errors import DflashEdgeError
from ..runtime.memory import available_bytes, rss_bytes

# The streamed writer's measured peaks (docs/BENCHMARKS.md, issue 15, session 9; the peak is
# parity's onnxruntime
# stage): SmolLM2-135M 0.54 GB of fp32 weights -> 0.87 GB, Qwen3-0.6B dims 2.39 GB -> 2.75 GB, i.e.
# ~1.0 x + 0.33 GB;
# with ~10-15% headroom:
EXPORT_PEAK_PER_WEIGHT_BYTE = 1.1
EXPORT_PEAK_FIXED_BYTES = 0.5e9


# bytes per weight the export's peak scales with, per precision: low-bit blocks with their scales;
# fp16 as fp32
# (parity's onnxruntime CPU session casts a float16 graph's weights to float32 when it loads them)
BYTES_PER_WEIGHT = {"fp32": 4.0, "fp16": 4.0, "int8": 1.125, "int4": 0.625}


def peak_weight_bytes(params: int, table_params: int, precision: str) -> int:
    """The weight bytes `check_fits` scales: the target at `precision`, plus, for low-bit bundles,
    the one float32 table parity's torch reference holds (the LM head, or the tied embedding; an
    untied embedding is read by rows; measured: docs/BENCHMARKS.md, "Exact low-bit imports")."""
    extra = 4 * table_params if precision in ("int8", "int4") else 0
    # unknown: named by the exporter later
    return int(params * BYTES_PER_WEIGHT.get(precision, 4.0) + extra)


class InsufficientMemoryError(DflashEdgeError):
    """The export would need more memory than this machine has available."""


def check_fits(weight_bytes: int, what: str) -> float:
    """Raise InsufficientMemoryError before starting when the estimated peak exceeds what is
    available.

    Returns the estimate in bytes.
    """
    need = EXPORT_PEAK_PER_WEIGHT_BYTE * weight_bytes + EXPORT_PEAK_FIXED_BYTES
    have = available_bytes()
    if have is not None and need > have + rss_bytes():
        raise InsufficientMemoryError(
            f"exporting {what} needs about {need / 1e9:.1f} GB of memory (estimate: "
            f"{EXPORT_PEAK_PER_WEIGHT_BYTE:g} x "
            f"its {weight_bytes / 1e9:.2f} GB of weights + {EXPORT_PEAK_FIXED_BYTES / 1e9:g} GB) "
            "but "
            f"{have / 1e9:.1f} GB is available; free memory, use a machine with more, or pass "
            "--no-memory-check "
            f"to try anyway"
        )
    return need

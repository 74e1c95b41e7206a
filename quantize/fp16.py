"""fp16: weights and most compute in float16, I/O float32 (models/float16_graph.py, onnxruntime's converter).

>>> info = quantize(model, QuantSettings())     # doctest: +SKIP
"""
from __future__ import annotations

from dflash_edge.models.float16_graph import KEEP_FP32, convert  # noqa: F401  (KEEP_FP32: what stays fp32)

from .precisions import QuantSettings


def quantize(model, settings: QuantSettings) -> dict:
    """Convert `model` to float16 in place (settings unused: fp16 has no knobs); returns what was done."""
    return convert(model)

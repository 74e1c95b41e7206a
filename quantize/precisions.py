"""Precision names, the re-export's weight settings and the errors of this room.

>>> check_precision("int4")
'int4'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..export.device_plan import EXPORT_PRECISIONS
from ..runtime.errors import DflashEdgeError

PRECISIONS = EXPORT_PRECISIONS  # highest first; every one written by the exporter itself


class QuantizeError(DflashEdgeError, ValueError):
    """A quantisation request that cannot be honoured (the message names the fix)."""


@dataclass(frozen=True)
class QuantSettings:
    """How re-quantised (non-GGUF) weights are stored; recorded in the manifest beside each graph.

    block_size: weights per scale along K (the CLI's --group-size; MatMulNBits /
    GatherBlockQuantized; power of 2, >= 16).
    accuracy_level: MatMulNBits' compute type for the activations (4 = int8, the fast CPU path and
    row-exact; 0 = fp32).
    """

    block_size: int = 32
    accuracy_level: int = 4

    def __post_init__(self):
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise QuantizeError(
                f"--group-size {self.block_size}: must be a power of two >= 16 (e.g. 32, 64, 128)"
            )
        if self.accuracy_level not in (0, 4):
            raise QuantizeError(
                f"--accuracy-level {self.accuracy_level}: choose 4 (int8 "
                f"activations, row-exact) or 0 (fp32)"
            )

    def to_dict(self) -> dict:
        return asdict(self)


def check_precision(name: str) -> str:
    if name not in PRECISIONS:
        raise QuantizeError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
    return name

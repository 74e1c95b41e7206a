"""Precision names, their order, the quantiser's settings and the errors of this room.

>>> check_precision("int4"), rank("fp16") > rank("int8")
('int4', True)
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from dflash_edge.runtime.errors import DflashEdgeError

# highest first: a graph can only be lowered from fp32, never raised or re-quantised
PRECISIONS = ("fp32", "fp16", "int8", "int4")


class QuantizeError(DflashEdgeError, ValueError):
    """A quantisation request that cannot be honoured (the message names the fix)."""


@dataclass(frozen=True)
class QuantSettings:
    """How weights are quantised; recorded in the manifest next to each graph's precision.

    block_size: weights per scale along K (MatMulNBits / GatherBlockQuantized; power of 2, >= 16).
    accuracy_level: MatMulNBits' compute type for the activations (4 = int8, the fast CPU path; 0 = fp32).
    embedding_bits: the tied embedding / LM head at int4 or int8: 0 = as the graph's precision
    (int4 -> 4, int8 -> 8), 8 = 8-bit blocks, -1 = left in fp32.
    symmetric: int4 MatMul weights without zero points (False: a 4-bit zero point per block).
    algorithm: int4 MatMul weights by onnxruntime's "rtn" (round to nearest, min/max scales) or "hqq"
    (half-quadratic: float scale and zero point per block, optimised; needs torch).
    """

    block_size: int = 32
    accuracy_level: int = 4
    embedding_bits: int = 0
    symmetric: bool = True
    algorithm: str = "rtn"

    def __post_init__(self):
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise QuantizeError(f"--block-size {self.block_size}: must be a power of two >= 16 (e.g. 32, 64, 128)")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise QuantizeError(f"--accuracy-level {self.accuracy_level}: choose 0 (unset), 1 (fp32), 2 (fp16), "
                                f"3 (bf16) or 4 (int8)")
        if self.embedding_bits not in (-1, 0, 4, 8):
            raise QuantizeError(f"--embedding-bits {self.embedding_bits}: choose 0 (as the graph), 4, 8 or -1 (fp32)")
        if self.algorithm not in ("rtn", "hqq"):
            raise QuantizeError(f"--algorithm {self.algorithm!r}: choose rtn or hqq")

    def to_dict(self) -> dict:
        return asdict(self)


def check_precision(name: str) -> str:
    if name not in PRECISIONS:
        raise QuantizeError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
    return name


def rank(name: str) -> int:
    """Bits of precision, for ordering: fp32 32 > fp16 16 > int8 8 > int4 4."""
    return {"fp32": 32, "fp16": 16, "int8": 8, "int4": 4}[check_precision(name)]


def check_lowering(graph: str, have: str, want: str) -> None:
    """Only an fp32 graph is quantised; asking for its own precision keeps it as it is."""
    check_precision(want)
    if want == have or have == "fp32":
        return
    verb = "raise" if rank(want) > rank(have) else "re-quantise"
    raise QuantizeError(f"graph {graph!r} is already {have}: cannot {verb} it to {want} (the lost precision "
                        f"cannot come back, and quantising twice compounds the error); quantise the fp32 bundle "
                        f"instead, or pass --{'draft' if graph == 'drafter' else 'target'} {have} to keep it")

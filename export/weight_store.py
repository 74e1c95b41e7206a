"""Every weight of a bundle's graphs, appended tensor by tensor to external-data files as the graphs
are written.

Each graph has its own data file (`DATA_FILES`; the fused target shares the portable target's), and
the tensors several graphs hold (the target's embedding / LM head, borrowed by the drafter) go once
to `shared.onnx.data`. A tensor is stored once per file: a name already placed there is referenced
without being computed again (the fused target reuses the portable target's weights that way), and
so is a tensor whose bytes are already there (sha256). Offsets are page-aligned, so onnxruntime maps
the files.

>>> store = WeightStore(Path("bundle"))                                          # doctest: +SKIP
>>> proto = store.tensor("target", "w.T", lambda: np.ones((256, 64), np.float32))   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..runtime.tensor_file import INLINE_BELOW, append_aligned

SHARED_FILE = (
    "shared.onnx.data"  # tensors several graphs hold (the target's embedding / LM head), once
)

# graph -> its external-data file: the fused target reuses the portable target's weights file
DATA_FILES = {
    "target": "target.onnx.data",
    "target_fused": "target.onnx.data",
    "drafter": "drafter.onnx.data",
    "target_hybrid": "target.onnx.data",
}
# TensorProto enums
ONNX_DTYPES = {
    "int64": 7,
    "int32": 6,
    "float32": 1,
    "float16": 10,
    "uint8": 2,
    "int8": 3,
    "uint4": 21,
    "int4": 22,
}


class Packed(NamedTuple):
    """A sub-byte tensor (int4 / uint4, export/dq_format.py): its bytes packed as onnx lays them
    out (two a byte, low nibble first), its element type and logical shape."""

    data: np.ndarray  # uint8, ceil(prod(shape) / 2) bytes
    dtype: str
    shape: tuple


class WeightStore:
    """External data for the graphs of one bundle folder; `stats[graph]` counts appended and reused
    bytes."""

    def __init__(self, root: Path):
        self.root = Path(root)
        # (file, name) -> offset, length,
        self.placed: dict[tuple[str, str], tuple[int, int, str, tuple]] = {}
        # dtype, shape; (file, sha) -> offset, length
        self.hashes: dict[tuple[str, bytes], tuple[int, int]] = {}
        self.shared: dict[str, dict] = {}  # key -> manifest entry
        self.stats: dict[str, dict[str, int]] = {}
        # weight key -> its MatMulNBits layout (export/weight_format.py)
        self.layouts: dict[str, tuple] = {}

    def open_graph(self, graph: str) -> None:
        """Create `graph`'s data file (empty) so the manifest can name it even if every tensor is
        reused."""
        (self.root / DATA_FILES[graph]).touch()
        self.stats.setdefault(graph, {"appended_bytes": 0, "reused_bytes": 0})

    def tensor(self, graph: str, name: str, make, shared: str | None = None):
        """TensorProto `name` of `graph`: inline when small, else external in the graph's file (or,
        with `shared`, the shared file under that key). `make`: an array or a function returning it,
        called only when `name` is not stored yet."""
        file = SHARED_FILE if shared else DATA_FILES[graph]
        stats = self.stats.setdefault(graph, {"appended_bytes": 0, "reused_bytes": 0})
        hit = self.placed.get((file, shared or name))
        if hit is None:
            array = make() if callable(make) else make
            packed = array if isinstance(array, Packed) else None
            array = np.ascontiguousarray(array.data if packed else array)
            if array.nbytes < INLINE_BELOW:  # inside the .onnx, as small constants are
                return _inline(name, array, packed)
            hit = self._append(file, array, stats)
            if packed:
                hit = (*hit[:2], packed.dtype, tuple(packed.shape))
            self.placed[(file, shared or name)] = hit
            del array
        else:
            stats["reused_bytes"] += hit[1]
        if shared:
            entry = self.shared.setdefault(
                shared,
                {
                    "file": file,
                    "offset": hit[0],
                    "length": hit[1],
                    "dtype": hit[2],
                    "shape": list(hit[3]),
                    "names": {},
                },
            )
            entry["names"][graph] = name
        return _external_proto(name, file, *hit)

    def _append(self, file: str, array: np.ndarray, stats: dict) -> tuple[int, int, str, tuple]:
        key = (file, hashlib.sha256(array.data).digest())
        if key in self.hashes:
            offset, length = self.hashes[key]
            stats["reused_bytes"] += length
        else:
            with open(self.root / file, "ab") as f:
                offset, length = append_aligned(f, array.data), array.nbytes
            self.hashes[key] = (offset, length)
            stats["appended_bytes"] += length
        return offset, length, str(array.dtype), tuple(array.shape)

    def manifest(self) -> list[dict]:
        """Shared entries held by two or more graphs (`shared_weights.tensors`)."""
        return [{"key": k, **e} for k, e in self.shared.items() if len(e["names"]) > 1]


def _inline(name: str, array: np.ndarray, packed: Packed | None):
    from onnx import TensorProto, numpy_helper

    if packed is None:
        return numpy_helper.from_array(array, name)
    return TensorProto(
        name=name,
        data_type=ONNX_DTYPES[packed.dtype],
        dims=list(packed.shape),
        raw_data=array.tobytes(),
    )


def _external_proto(name: str, file: str, offset: int, length: int, dtype: str, shape: tuple):
    from onnx import TensorProto

    proto = TensorProto(
        name=name,
        data_type=ONNX_DTYPES[dtype],
        dims=list(shape),
        data_location=TensorProto.EXTERNAL,
    )
    for k, v in (("location", file), ("offset", str(offset)), ("length", str(length))):
        entry = proto.external_data.add()
        entry.key, entry.value = k, v
    return proto

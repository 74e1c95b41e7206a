"""Write a graph's weights as external data, one tensor at a time; store tensors two graphs share once.

`write_external` moves every tensor of an ONNX model (initializers and Constant-node values, inline
or in the exporter's per-tensor files) into `<graph>.onnx.data`, page-aligned so onnxruntime can map
it. Tensors listed in `SharedData` (the target's embedding / LM head, which the drafter borrows) go to
`shared.onnx.data` instead, written by the first graph that holds them and referenced by the next.

>>> shared = SharedData(bundle_dir, {"embed": embed_weight})              # doctest: +SKIP
>>> write_external(model, scratch, bundle_dir / "target.onnx", "target", shared)   # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from dflash_edge.runtime.tensor_file import ALIGN, INLINE_BELOW, append_aligned  # noqa: F401  (the layout, shared)

SHARED_FILE = "shared.onnx.data"


class SharedData:
    """Tensors (given as torch/numpy arrays) that several graphs hold byte for byte, written once.

    After export, `entries` lists each one: file, offset, length, dtype, shape and its name in each graph.
    """

    def __init__(self, root: Path, tensors: dict[str, list]):
        """`tensors`: key -> the forms a graph may store it in (e.g. a weight and its transpose)."""
        self.path = Path(root) / SHARED_FILE
        self.wanted: dict[tuple[int, str], str] = {}          # (bytes, sha256) -> key
        for key, forms in tensors.items():
            for t in forms:
                arr = t.detach().cpu().contiguous().numpy() if hasattr(t, "detach") else np.ascontiguousarray(t)
                self.wanted[(arr.nbytes, _sha(arr.data))] = key
        self.lengths = {n for n, _ in self.wanted}
        self.entries: dict[str, dict] = {}

    def place(self, blob: bytes, graph: str, name: str, dtype: str, shape) -> int | None:
        """Offset of `blob` in the shared file if it is a shared tensor (written on first sight), else None."""
        if len(blob) not in self.lengths:
            return None
        key = self.wanted.get((len(blob), _sha(blob)))
        if key is None:
            return None
        if key not in self.entries:
            with open(self.path, "ab") as f:
                offset = append_aligned(f, blob)
            self.entries[key] = {"file": SHARED_FILE, "offset": offset, "length": len(blob), "dtype": dtype,
                                 "shape": list(shape), "names": {}}
        self.entries[key]["names"][graph] = name
        return self.entries[key]["offset"]

    def adopt(self, graph: str, placed: dict[str, tuple[str, int]]) -> None:
        """Record `graph`'s names for shared tensors it references by (file, offset) (a graph built directly)."""
        for name, (file, offset) in placed.items():
            for entry in self.entries.values():
                if (entry["file"], entry["offset"]) == (file, offset):
                    entry["names"][graph] = name

    def manifest(self) -> list[dict]:
        """Entries held by two or more graphs (the rest are plain weights of one graph)."""
        return [{"key": k, **e} for k, e in self.entries.items() if len(e["names"]) > 1]


def write_external(model, scratch: Path, path: Path, graph: str, shared: SharedData | None = None) -> None:
    """Save `model` as `path` + `path.data`, reading tensor data from `scratch` (the exporter's folder)."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    data_name = path.name + ".data"
    with open(path.parent / data_name, "wb") as own:
        for tensor, is_attribute in _all_tensors(model.graph):
            blob = _tensor_bytes(tensor, scratch)
            if len(blob) < INLINE_BELOW or is_attribute:      # Constant values stay in the graph, as before
                _set_inline(tensor, blob)
                continue
            offset = None
            if shared is not None:
                dtype = str(tensor_dtype_to_np_dtype(tensor.data_type))
                offset = shared.place(blob, graph, tensor.name, dtype, tensor.dims)
            location = data_name if offset is None else SHARED_FILE
            if offset is None:
                offset = append_aligned(own, blob)
            _clear_data(tensor)
            for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(blob)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
            tensor.data_location = onnx.TensorProto.EXTERNAL
    onnx.save_model(model, str(path))


def _all_tensors(graph):
    """(tensor, is a node attribute) for every initializer and Constant value of `graph`."""
    for init in graph.initializer:
        yield init, False
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t, True


def _tensor_bytes(tensor, scratch: Path) -> bytes:
    import onnx
    from onnx import numpy_helper

    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        with open(scratch / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0)))
            return f.read(int(info["length"])) if "length" in info else f.read()
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    return numpy_helper.to_array(tensor).tobytes()


def _clear_data(tensor) -> None:
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        tensor.ClearField(field)
    del tensor.external_data[:]


def _set_inline(tensor, blob: bytes) -> None:
    import onnx

    _clear_data(tensor)
    tensor.data_location = onnx.TensorProto.DEFAULT
    tensor.raw_data = blob


def _sha(blob) -> str:
    return hashlib.sha256(blob).hexdigest()

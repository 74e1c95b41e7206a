"""Where a quantiser reads a weight and puts its packed form: in the model, or streamed file to file.

A quantiser asks `weights.array(init)` for a weight, calls `weights.done(init)` when finished with it
and gets each new tensor from `weights.put(array, name)`. `InModel` keeps everything in the ModelProto
(the graph was loaded with its data). `Streamed` reads from read-only memory maps of the source bundle's
data files (a weight's pages are dropped from this process once it is done) and appends each new tensor
to the new graph's data file at once, page-aligned, or points it at identical bytes already stored
(`TensorIndex`): no copy of the model's weights is ever held in memory.

>>> with SourceTensors(src_dir) as src, TensorSink(out_dir, "target.onnx.data", index) as sink:   # doctest: +SKIP
...     quantize(model, settings, Streamed(src, sink)); sink.copy_rest(model, src)
"""
from __future__ import annotations

import hashlib
import mmap
from pathlib import Path

import numpy as np

from dflash_edge.runtime.tensor_file import (EXTERNAL, INLINE_BELOW, append_aligned, external_info, set_external,
                                             set_inline)

from .dedupe import TensorIndex


class InModel:
    """Weights held by the ModelProto itself (loaded with `load_external_data=True`)."""

    def array(self, init) -> np.ndarray:
        from onnx import numpy_helper

        return numpy_helper.to_array(init)

    def done(self, init) -> None:
        pass

    def put(self, array: np.ndarray, name: str):
        from onnx import numpy_helper

        return numpy_helper.from_array(array, name)


class SourceTensors:
    """Read-only memory maps of the data files beside a source graph, opened on first use."""

    def __init__(self, folder: Path):
        self.folder, self.maps = Path(folder), {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for m in self.maps.values():
            m.close()
        self.maps.clear()

    def _where(self, tensor) -> tuple[mmap.mmap, int, int]:
        info = external_info(tensor)
        if info["location"] not in self.maps:
            with open(self.folder / info["location"], "rb") as f:
                self.maps[info["location"]] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        m = self.maps[info["location"]]
        length = info["length"] if info["length"] is not None else len(m) - info["offset"]
        if info["offset"] + length > len(m):
            raise ValueError(f"tensor {tensor.name!r} ends past the end of {info['location']} "
                             f"({info['offset']} + {length} > {len(m)} bytes): the source bundle is damaged; re-export it")
        return m, info["offset"], length

    def array(self, tensor) -> np.ndarray:
        """The tensor's values: a read-only view of the memory map (external) or a copy (inline)."""
        from onnx import numpy_helper
        from onnx.helper import tensor_dtype_to_np_dtype

        if tensor.data_location != EXTERNAL:
            return numpy_helper.to_array(tensor)
        m, offset, length = self._where(tensor)
        dtype = np.dtype(tensor_dtype_to_np_dtype(tensor.data_type))
        return np.frombuffer(m, dtype, count=length // dtype.itemsize, offset=offset).reshape(tuple(tensor.dims))

    def spill(self, tensor, place) -> None:
        """`place(blob)` with an external tensor's bytes (a view of the map), then its pages dropped."""
        m, offset, length = self._where(tensor)
        place(memoryview(m)[offset:offset + length])
        _drop(m, offset, length)

    def release(self, tensor) -> None:
        """Drop the tensor's pages from this process (the kernel's page cache keeps them for other readers)."""
        if tensor.data_location == EXTERNAL:
            _drop(*self._where(tensor))


def _drop(m: mmap.mmap, offset: int, length: int) -> None:
    start = offset - offset % mmap.PAGESIZE
    if length:
        m.madvise(mmap.MADV_DONTNEED, start, offset + length - start)


class TensorSink:
    """One new data file, appended tensor by tensor; bytes an earlier tensor stored are referenced instead."""

    def __init__(self, root: Path, name: str, index: TensorIndex):
        self.root, self.name, self.index = Path(root), name, index
        self.borrowed: set[str] = set()          # other graphs' data files this graph now references
        self.file = open(self.root / name, "wb")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()

    def place(self, tensor, blob) -> None:
        """Make `blob` (bytes-like) `tensor`'s data: inline under INLINE_BELOW bytes, else stored once."""
        blob = memoryview(blob).cast("B")
        if blob.nbytes < INLINE_BELOW:
            set_inline(tensor, blob)
            return
        key = hashlib.sha256(blob).digest()
        where = self.index.where.get(key)
        if where is None:
            where = self.index.where[key] = (self.name, append_aligned(self.file, blob), blob.nbytes)
        elif where[0] != self.name:
            self.borrowed.add(where[0])
        set_external(tensor, *where)

    def put(self, array: np.ndarray, name: str):
        """A new TensorProto `name` holding `array`, its data placed at once."""
        from onnx import TensorProto
        from onnx.helper import np_dtype_to_tensor_dtype

        array = np.ascontiguousarray(array)
        tensor = TensorProto(name=name, dims=array.shape, data_type=np_dtype_to_tensor_dtype(array.dtype))
        self.place(tensor, array.data)
        return tensor

    def copy_rest(self, model, source: SourceTensors, names: set[str]) -> None:
        """The source's initializers `names` left as they were: bytes in the source's files copied (or shared)
        one tensor at a time, inline ones of INLINE_BELOW bytes or more moved out as onnx's save would."""
        for init in model.graph.initializer:
            if init.name not in names:
                continue
            if init.data_location == EXTERNAL:
                source.spill(init, lambda blob: self.place(init, blob))   # noqa: B023 (called at once)
            elif len(init.raw_data) >= INLINE_BELOW:
                self.place(init, init.raw_data)


class Streamed:
    """Weights read from `source`'s memory maps, new tensors appended to `sink` as they are made."""

    def __init__(self, source: SourceTensors, sink: TensorSink):
        self.source, self.sink = source, sink

    def array(self, init) -> np.ndarray:
        return self.source.array(init)

    def done(self, init) -> None:
        self.source.release(init)

    def put(self, array: np.ndarray, name: str):
        return self.sink.put(array, name)

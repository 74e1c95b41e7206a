"""The external-data locations an ONNX file names, read from its protobuf bytes (no `onnx` import).

onnxruntime 1.32 refuses a `location` outside the model's folder, but 1.17 (our floor) reads
`../x` and follows symlinks; the runtime checks the locations itself before a session is built
(bundle.graph_path). Only the messages that can hold a tensor are walked (model -> graph ->
initializers, nodes' attributes, subgraphs, functions); everything else is skipped by its
length, so a large graph costs one pass.

>>> external_locations("bundle/target.onnx")     # doctest: +SKIP
{'target.onnx.data'}
"""

from __future__ import annotations

import mmap
from pathlib import Path

# message -> {field number: message type of that (length-delimited) field}; onnx.proto3's numbers
FIELDS: dict[str, dict[int, str]] = {
    "model": {7: "graph", 25: "function"},
    "graph": {1: "node", 5: "tensor", 15: "sparse"},
    "function": {7: "node"},
    "node": {5: "attribute"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 22: "sparse", 23: "sparse"},
    "sparse": {1: "tensor", 2: "tensor"},
    "tensor": {13: "entry"},
    "entry": {},
}
KEY, VALUE = 1, 2  # StringStringEntryProto
MAX_DEPTH = 64  # nested subgraphs; a file nested deeper is hostile


class OnnxScanError(ValueError):
    """The file is not a well-formed ONNX protobuf."""


def external_locations(path: str | Path) -> set[str]:
    """Every `location` of an external-data entry anywhere in the ONNX file at `path`."""
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            raise OnnxScanError(f"{path} is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _scan(memoryview(data))


def _scan(buf: memoryview) -> set[str]:
    found: set[str] = set()
    stack = [("model", 0, len(buf), 0)]  # (message type, start, end, depth)
    try:
        while stack:
            kind, start, end, depth = stack.pop()
            if depth > MAX_DEPTH:
                raise OnnxScanError(f"messages nested deeper than {MAX_DEPTH}")
            if kind == "entry":
                key, value = _entry(buf, start, end)
                if key == "location":
                    found.add(value)
                continue
            for number, lo, hi in _fields(buf, start, end):
                child = FIELDS[kind].get(number)
                if child is not None and hi is not None:
                    stack.append((child, lo, hi, depth + 1))
    finally:
        buf.release()
    return found


def _entry(buf: memoryview, start: int, end: int) -> tuple[str, str]:
    parts = {n: bytes(buf[lo:hi]) for n, lo, hi in _fields(buf, start, end) if hi is not None}
    try:
        return parts.get(KEY, b"").decode(), parts.get(VALUE, b"").decode()
    except UnicodeDecodeError as err:
        raise OnnxScanError(f"an external-data entry is not UTF-8 ({err})") from None


def _fields(buf: memoryview, pos: int, end: int):
    """(field number, start, end) of each field in buf[pos:end]; end None: not a length field."""
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        wire = tag & 7
        if wire == 0:
            _, pos = _varint(buf, pos, end)
            yield tag >> 3, pos, None
        elif wire == 2:
            size, pos = _varint(buf, pos, end)
            if pos + size > end:
                raise OnnxScanError(f"a field of {size} bytes runs past its message's end")
            yield tag >> 3, pos, pos + size
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > end:
                raise OnnxScanError("a fixed-size field runs past its message's end")
            yield tag >> 3, pos, None
        else:
            raise OnnxScanError(f"wire type {wire} at byte {pos}: not an ONNX model")


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise OnnxScanError(f"a truncated or overlong varint at byte {pos}")
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos

"""How a bundle's `.onnx.data` files lay tensors out: page-aligned offsets, tensors under 1 KiB
inline.

Part of the bundle contract (onnxruntime maps aligned external data instead of copying it), so it
lives in runtime/ (floor 2) where both export/ and quantize/ (floor 4) write through it.

>>> import io
>>> f = io.BytesIO(b"x")
>>> f.seek(0, 2), append_aligned(f, b"weights"), f.tell()
(1, 4096, 4103)
"""

from __future__ import annotations

INLINE_BELOW = 1024  # bytes: smaller tensors stay in the .onnx file
ALIGN = (
    4096  # offsets on page boundaries: onnxruntime maps aligned external data instead of copying
)
DEFAULT, EXTERNAL = 0, 1  # onnx.TensorProto's data locations (runtime/ does not import onnx)


def append_aligned(f, blob) -> int:
    """Write `blob` (bytes-like) at the next ALIGN boundary of file `f` (open for appending);
    returns its offset."""
    pad = -f.tell() % ALIGN
    if pad:
        f.write(b"\0" * pad)
    offset = f.tell()
    f.write(blob)
    return offset


def external_info(tensor) -> dict:
    """An external tensor's location, offset and length (length None: to the end of the file)."""
    info = {e.key: e.value for e in tensor.external_data}
    length = info.get("length")
    return {
        "location": info["location"],
        "offset": int(info.get("offset", 0)),
        "length": int(length) if length is not None else None,
    }


def set_external(tensor, location: str, offset: int, length: int) -> None:
    """Point `tensor` (an onnx TensorProto) at `length` bytes of `location` from `offset`; drops
    inline data."""
    _clear(tensor)
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = EXTERNAL


def set_inline(tensor, blob) -> None:
    """Hold `blob` (bytes-like) in `tensor` itself."""
    _clear(tensor)
    tensor.data_location = DEFAULT
    tensor.raw_data = bytes(blob)


def _clear(tensor) -> None:
    for name in (
        "raw_data",
        "float_data",
        "int32_data",
        "int64_data",
        "double_data",
        "uint64_data",
        "string_data",
    ):
        tensor.ClearField(name)
    del tensor.external_data[:]

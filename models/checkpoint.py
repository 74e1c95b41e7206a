"""A checkpoint folder as its publisher ships it, read lazily, one tensor at a time.

Either one `model.safetensors` or shards listed in `model.safetensors.index.json` (what
`save_pretrained` writes above its shard size). Only headers are read up front; `get(name)` reads
one tensor in the checkpoint's own dtype, so loading never holds a second full copy of the model;
`array(name)` reads one as float32 numpy without torch (the streamed export).

>>> ckpt = Checkpoint.open("Qwen3-8B/")                        # doctest: +SKIP
>>> ckpt.shape("model.embed_tokens.weight"), ckpt.dtype("model.norm.weight")   # doctest: +SKIP
((151936, 4096), 'BF16')
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..runtime.bundle import inside
from ..runtime.errors import CorruptFileError, ModelFormatError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
BLOCKS = (
    "gguf_blocks.safetensors"  # a low-bit GGUF's exact MatMulNBits operands (models/gguf_import.py)
)
FLOAT_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
ITEM_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
}
# read as; BF16 widened to float32
_NUMPY = {
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "F64": "<f8",
}
# config.json's torch_dtype (transformers >= 5: `dtype`) -> safetensors dtype
CONFIG_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


@dataclass
class _Entry:
    shard: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int = 0  # byte offset of the tensor's data in its shard


class Checkpoint:
    """Tensor name -> (shard, dtype, shape) from the files' headers; tensors read on demand."""

    def __init__(self, root: Path, entries: dict[str, _Entry]):
        self.root, self.entries = root, entries
        self._handles: dict[Path, object] = {}

    @classmethod
    def open(cls, root: str | Path) -> "Checkpoint":
        """Index every tensor of `root` (sharded or single file); bad layouts raise
        ModelFormatError."""
        root = Path(root).expanduser()
        if (root / INDEX).is_file():
            return cls(root, _indexed_entries(root))
        if (root / SINGLE).is_file():
            return cls(root, _shard_entries(root / SINGLE))
        raise ModelFormatError(
            f"{root} holds neither {SINGLE} nor {INDEX}: a checkpoint folder needs its "
            f"safetensors weights (re-download it, or save it with save_pretrained)"
        )

    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def dtype(self, name: str) -> str:
        return self.entries[name].dtype

    @property
    def nbytes(self) -> int:
        """Bytes of all tensors as stored."""
        return sum(_numel(e.shape) * FLOAT_DTYPES.get(e.dtype, 1) for e in self.entries.values())

    def num_params(self, skip: tuple[str, ...] = ()) -> int:
        return sum(_numel(e.shape) for n, e in self.entries.items() if n not in skip)

    def get(self, name: str):
        """One tensor (torch, the checkpoint's dtype), read from its shard."""
        from safetensors import safe_open

        entry = self.entries[name]
        if entry.shard not in self._handles:
            self._handles[entry.shard] = safe_open(str(entry.shard), framework="pt")
        return self._handles[entry.shard].get_tensor(name)

    def array(self, name: str, shape: tuple[int, ...] | None = None, rows: slice | None = None):
        """One tensor as float32 numpy (bf16 / fp16 widened exactly), read from its shard without
        torch.

        `shape`: what the caller expects; a different shape raises ModelFormatError naming the
        tensor. `rows`: only these rows of the first axis (a 151,936-row table read a chunk at a
        time)."""
        import numpy as np

        e = lookup(self.root, self.entries, name, shape)
        if e.dtype not in _NUMPY:
            raise ModelFormatError(
                f"{self.root}: tensor {name} is {e.dtype}; only float checkpoints are supported"
            )
        out_shape, offset = e.shape, e.offset
        if rows is not None:  # contiguous rows: an offset and a count
            start, stop, _ = rows.indices(e.shape[0])
            row = _numel(e.shape[1:])
            out_shape, offset = (
                (max(stop - start, 0), *e.shape[1:]),
                e.offset + start * row * FLOAT_DTYPES[e.dtype],
            )
        raw = np.fromfile(e.shard, dtype=_NUMPY[e.dtype], count=_numel(out_shape), offset=offset)
        if e.dtype == "BF16":  # bf16 is the top half of a float32: widen exactly
            wide = raw.astype(np.uint32)
            del raw
            wide <<= 16
            return wide.view(np.float32).reshape(out_shape)
        return raw.astype(np.float32, copy=False).reshape(out_shape)

    def nbits(self, name: str):
        """Weight `name` as exact low-bit MatMulNBits operands (models/nbits.NBitsWeight) when the
        checkpoint was imported from a low-bit GGUF (its `gguf_blocks.safetensors`), else None (a
        float weight only)."""
        blocks = self._block_file
        if blocks is None or name not in blocks[1]:
            return None
        from .nbits import FIELDS, NBitsWeight

        handle, meta, keys = blocks
        return NBitsWeight.from_arrays(
            meta[name],
            {f: handle.get_tensor(f"{name}/{f}") for f in FIELDS if f"{name}/{f}" in keys},
        )

    def unmapped_low_bit(self) -> dict[str, str]:
        """{weight: GGUF type} of the source's low-bit tensors with no exact mapping (the exporter
        re-quantises them)."""
        blocks = self._block_file
        return {} if blocks is None else json.loads(blocks[1].get("unmapped", "{}"))

    @cached_property
    def _block_file(self):
        """(safetensors handle, metadata, tensor names) of `gguf_blocks.safetensors`, or None when
        there is none."""
        path = self.root / BLOCKS
        if not path.is_file():
            return None
        from safetensors import SafetensorError, safe_open

        _data_offsets(path)  # bounded checks before the library maps it
        try:
            handle = safe_open(str(path), framework="numpy")
        except (SafetensorError, OSError) as err:
            raise CorruptFileError.at(path, f"safetensors refused it ({err})") from err
        return handle, handle.metadata() or {}, set(handle.keys())

    def close(self) -> None:
        self._handles.clear()

    def check_dtypes(self, declared: str | None) -> None:
        """Every tensor is a float, and of `declared` (config.json's torch_dtype) when the config
        names one."""
        want = CONFIG_DTYPES.get(str(declared or "").removeprefix("torch."))
        bad = [
            f"{n} ({e.dtype})"
            for n, e in self.entries.items()
            if e.dtype not in FLOAT_DTYPES or (want and e.dtype != want)
        ]
        if bad:
            hint = (
                f"config.json declares torch_dtype {declared!r}; fix torch_dtype or re-save the "
                "weights in it"
                if want
                else "quantised checkpoints are not supported: use the float (bf16/fp16/fp32) "
                "release"
            )
            raise ModelFormatError(
                f"{self.root}: tensor dtype does not match: {_preview(bad)}; {hint}"
            )


def lookup(root, table: dict, name: str, shape=None):
    """`table[name]` (a checkpoint's entry with a `.shape`), or a ModelFormatError naming the
    missing or misshaped tensor; `shape` (optional): the shape the model expects."""
    if name not in table:
        raise ModelFormatError(
            f"{root}: tensor {name} is missing — the weights do not match config.json"
        )
    entry = table[name]
    if shape is not None and tuple(shape) != entry.shape:
        raise ModelFormatError(
            f"{root}: misshaped tensor {name}: file {entry.shape} vs model {tuple(shape)} "
            "— the weights do not match config.json"
        )
    return entry


def check_shapes(
    expected: dict[str, tuple[int, ...]], ckpt: Checkpoint, ignore: tuple[str, ...] = ()
) -> list[str]:
    """The names to load of `expected` (name -> shape); missing, misshaped and unexpected tensors in
    one error.

    torch-free: the streamed export checks a checkpoint with it before reading any weight
    (models/names.py)."""
    have = set(ckpt.names())
    missing = sorted(set(expected) - have)
    unexpected = sorted(have - set(expected) - set(ignore))
    misshaped = [
        f"{k}: file {ckpt.shape(k)} vs model {shape}"
        for k, shape in expected.items()
        if k in have and ckpt.shape(k) != shape
    ]
    problems = [
        f"{what} tensors {_preview(items)}"
        for what, items in (
            ("missing", missing),
            ("misshaped", misshaped),
            ("unexpected", unexpected),
        )
        if items
    ]
    if problems:
        raise ModelFormatError(
            f"{ckpt.root}: " + "; ".join(problems) + " — the weights do not match config.json"
        )
    return list(expected)


def _indexed_entries(root: Path) -> dict[str, _Entry]:
    try:
        weight_map = json.loads((root / INDEX).read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ModelFormatError(
            f"{root / INDEX} is not a safetensors index (no readable weight_map: {err}); "
            f"re-download it"
        ) from err
    if not isinstance(weight_map, dict):
        raise ModelFormatError(f"{root / INDEX}: weight_map is not a JSON object; re-download it")
    for shard in {s if isinstance(s, str) else None for s in weight_map.values()}:  # None: bad
        _shard_path(root, shard)
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if not (root / s).is_file()]
    if missing:
        raise ModelFormatError(
            f"{root / INDEX} lists shard(s) {_preview(missing)} that are not in {root}; "
            f"the download is incomplete: fetch the missing files"
        )
    entries: dict[str, _Entry] = {}
    for shard in shards:
        entries.update(_shard_entries(root / shard))
    absent = [
        f"{n} (in {s})"
        for n, s in weight_map.items()
        if n not in entries or entries[n].shard.name != s
    ]
    if absent:
        raise ModelFormatError(
            f"{root / INDEX} names tensor(s) no listed shard holds: {_preview(absent)}; "
            f"the index and the shards disagree: re-download the checkpoint"
        )
    return {n: entries[n] for n in weight_map}


def _shard_path(root: Path, shard) -> Path:
    """root / shard, refused unless inside `root`. A Hugging Face cache snapshot
    (`snapshots/<rev>/`) links its files into the repo's `blobs/`, so there symlinks may lead up
    to the repo's folder, no further."""
    home = root.resolve().parent.parent if root.resolve().parent.name == "snapshots" else root
    return inside(root, shard, f"{root / INDEX} weight_map", ModelFormatError, home)


def _shard_entries(path: Path) -> dict[str, _Entry]:
    from safetensors import SafetensorError, safe_open

    offsets = _data_offsets(path)  # bounded: nothing read past the header
    try:
        with safe_open(str(path), framework="numpy") as f:  # the library's own checks, too
            names = list(f.keys())
    except (SafetensorError, OSError) as err:
        raise CorruptFileError.at(path, f"safetensors refused it ({err})") from err
    return {n: _Entry(path, *offsets[n]) for n in names}


def _data_offsets(path: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """name -> (dtype, shape, absolute data offset) from a safetensors header (8-byte length +
    JSON); every declared size is checked against the file's before anything is read from it."""

    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CorruptFileError.at(path, f"it holds {size} bytes, fewer than a header length")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise CorruptFileError.at(
                path, f"its header declares {length} bytes; the file holds {size}"
            )
        header = _json_header(path, f.read(length))
    header.pop("__metadata__", None)
    return {n: _check_entry(path, n, h, size - 8 - length, 8 + length) for n, h in header.items()}


def _json_header(path: Path, raw: bytes) -> dict:
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise CorruptFileError.at(path, f"its header is not JSON ({err})") from None
    if not isinstance(header, dict):
        kind = type(header).__name__
        raise CorruptFileError.at(path, f"its header is a JSON {kind}, not an object")
    return header


def _check_entry(path: Path, name: str, h, data_bytes: int, data_start: int):
    """(dtype, shape, absolute offset) of one header entry whose bytes lie in the data region."""
    what = f"tensor {name[:80]!r}"
    ok = (
        isinstance(h, dict)
        and isinstance(h.get("dtype"), str)
        and _ints(h.get("shape"))
        and _ints(h.get("data_offsets"))
        and len(h["data_offsets"]) == 2
    )
    if not ok:
        raise CorruptFileError.at(
            path, f"{what} has no dtype / shape / data_offsets of the safetensors form"
        )
    (begin, end), shape = h["data_offsets"], tuple(h["shape"])
    if not 0 <= begin <= end <= data_bytes:
        raise CorruptFileError.at(
            path, f"{what}: bytes [{begin}, {end}) lie outside the {data_bytes}-byte data region"
        )
    item = ITEM_BYTES.get(h["dtype"])
    if item is not None and _numel(shape) * item != end - begin:
        raise CorruptFileError.at(
            path,
            f"{what} of shape {shape[:8]} ({h['dtype']}) does not fill its {end - begin} bytes",
        )
    return h["dtype"], shape, data_start + begin


def _ints(value) -> bool:
    """A short list of non-negative ints (shapes, offsets): not a bool, not a float."""
    return (
        isinstance(value, list)
        and len(value) <= 8
        and all(type(v) is int and v >= 0 for v in value)
    )


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _preview(items: list[str], n: int = 6) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more

"""A bounded walk over a GGUF file's header, before `gguf.GGUFReader` reads it.

GGUFReader trusts the counts it reads: an array that declares 2**40 one-byte items past the end
of the file makes it loop for ever, growing memory (820 MB in 30 s from a 98 MB file, 773 MB in
15 s from an 89 KB one), and a tensor whose dims overflow wraps its uint64 product. This walk
reads the header through a read-only memory map with `struct` and checks every count, length,
dim and offset against the bytes that are left; it allocates nothing in proportion to a declared
size. A bad file gets one CorruptFileError naming what is wrong.

    >>> check_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))          # doctest: +SKIP
    GgufSummary(tensors=272, items=147205, data_end=98362432)
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from ..runtime.errors import CorruptFileError

HEADER_BYTES = 24  # magic, version, tensor count, kv count
VERSIONS = (2, 3)  # what gguf.GGUFReader reads
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_DEPTH = 2  # an array of arrays at most (GGUFReader recurses per item)
# GGUFValueType -> bytes
SCALARS = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY, UINT32 = 8, 9, 4
MIN_KV, MIN_TENSOR = 8 + 4 + 1, 8 + 4 + 4 + 8  # smallest key/value and tensor-info records
MIN_ITEM = {STRING: 8, ARRAY: 12}
# GGUFReader keeps ~1 KB of Python objects per metadata array item; real files spend >= 600 bytes
# of file per item (SmolLM2-135M Q4_1: 147,205 items in 98 MB), so more items than a file's
# size / 256 (+ 4,096 for tiny files) mark a hostile header
BYTES_PER_ITEM, FREE_ITEMS = 256, 4096


@dataclass(frozen=True)
class TensorInfo:
    """One tensor record, checked: where its bytes lie in the file."""

    name: str
    dims: tuple[int, ...]  # GGUF order (innermost first)
    qtype: int  # a GGMLQuantizationType value
    offset: int  # absolute byte offset of its data
    nbytes: int


@dataclass(frozen=True)
class GgufSummary:
    tensors: int
    items: int  # metadata array items, all arrays together
    data_end: int  # the end of the last tensor's data (bytes)
    table: tuple[TensorInfo, ...] = ()  # every tensor, in file order


def check_gguf(path: Path) -> GgufSummary:
    """Walk `path`'s header and tensor table; CorruptFileError unless every size fits the file."""
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise corrupt(path, f"it holds {size} bytes, fewer than a GGUF header ({HEADER_BYTES})")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return _walk(_Cursor(buf, path))


def corrupt(path: Path, what: str) -> CorruptFileError:
    return CorruptFileError.at(path, what)


class _Cursor:
    """A position in the mapped file; every read is checked against the bytes left."""

    def __init__(self, buf, path: Path):
        self.buf, self.path, self.pos, self.order, self.items = buf, path, 0, "<", 0

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def need(self, n: int, what: str) -> int:
        """Consume `n` bytes; returns where they start."""
        if n > self.left:
            raise corrupt(
                self.path,
                f"{what} needs {n} bytes at offset {self.pos}, past the end "
                f"of the file ({len(self.buf)} bytes)",
            )
        start, self.pos = self.pos, self.pos + n
        return start

    def uint(self, fmt: str, what: str) -> int:
        at = self.need(struct.calcsize(fmt), what)
        return struct.unpack_from(self.order + fmt, self.buf, at)[0]

    def string(self, what: str) -> str:
        """A UTF-8 string (GGUFReader decodes keys, names and values with `str(.., 'utf-8')`)."""
        n = self.uint("Q", f"{what}'s length")
        start = self.need(n, f"{what} ({n} bytes)")
        try:
            return self.buf[start : start + n].decode("utf-8")
        except UnicodeDecodeError as err:
            bad = corrupt(self.path, f"{what} at offset {start} is not UTF-8 ({err.reason})")
        raise bad from None

    def count(self, n: int, what: str) -> None:
        """Add `n` array items to the budget: no more than the file's size allows."""
        self.items += n
        limit = len(self.buf) // BYTES_PER_ITEM + FREE_ITEMS
        if self.items > limit:
            raise corrupt(
                self.path,
                f"{what} brings the metadata to {self.items} array items, "
                f"more than a {len(self.buf)}-byte file can hold ({limit})",
            )


def _walk(cur: _Cursor) -> GgufSummary:
    if bytes(cur.buf[:4]) != b"GGUF":
        raise corrupt(cur.path, f"it starts with {bytes(cur.buf[:4])!r}, not the GGUF magic")
    cur.need(4, "the magic")
    version = cur.uint("I", "the version")
    if version & 0xFFFF == 0:  # written on a big-endian machine
        cur.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in VERSIONS:
        raise corrupt(cur.path, f"GGUF version {version} is not one of {VERSIONS}")
    n_tensors, n_kv = cur.uint("Q", "the tensor count"), cur.uint("Q", "the metadata count")
    if n_kv * MIN_KV + n_tensors * MIN_TENSOR > cur.left:
        raise corrupt(
            cur.path,
            f"it declares {n_tensors} tensors and {n_kv} metadata keys; their "
            f"records alone would exceed the {cur.left} bytes left",
        )
    alignment = _metadata(cur, n_kv)
    tensors = [_tensor_info(cur, i) for i in range(n_tensors)]
    data_start = -(-cur.pos // alignment) * alignment
    end = _check_data(cur, tensors, data_start)
    table = tuple(replace(t, offset=data_start + t.offset) for t in tensors)
    return GgufSummary(n_tensors, cur.items, end, table)


def _metadata(cur: _Cursor, n_kv: int) -> int:
    """Skip the key/value records; returns `general.alignment` (32 when absent)."""
    alignment = 32
    for i in range(n_kv):
        name = cur.string(f"metadata key #{i}")
        vtype = cur.uint("I", f"the type of {name[:80]!r}")
        if name == "general.alignment":
            if vtype != UINT32:
                raise corrupt(cur.path, f"general.alignment has type {vtype}, not uint32")
            alignment = cur.uint("I", "general.alignment")
            if alignment == 0 or alignment & (alignment - 1):
                raise corrupt(cur.path, f"general.alignment {alignment} is not a power of two")
            continue
        _skip_value(cur, vtype, 0, repr(name[:80]))
    return alignment


def _skip_value(cur: _Cursor, vtype: int, depth: int, what: str) -> None:
    if vtype in SCALARS:
        cur.need(SCALARS[vtype], what)
    elif vtype == STRING:
        cur.string(what)
    elif vtype == ARRAY:
        _skip_array(cur, depth, what)
    else:
        raise corrupt(cur.path, f"{what} has value type {vtype}, which GGUF does not define")


def _skip_array(cur: _Cursor, depth: int, what: str) -> None:
    if depth >= MAX_DEPTH:
        raise corrupt(cur.path, f"{what} nests arrays deeper than {MAX_DEPTH}")
    itype, n = cur.uint("I", f"{what}'s item type"), cur.uint("Q", f"{what}'s length")
    cur.count(n, what)
    if itype in SCALARS:
        cur.need(n * SCALARS[itype], f"{what}'s {n} items")
        return
    if itype not in MIN_ITEM:
        raise corrupt(cur.path, f"{what} has item type {itype}, which GGUF does not define")
    if n * MIN_ITEM[itype] > cur.left:
        raise corrupt(
            cur.path, f"{what} declares {n} items; they cannot fit in the {cur.left} bytes left"
        )
    for _ in range(n):
        _skip_value(cur, itype, depth + 1, what)


def _tensor_info(cur: _Cursor, i: int) -> TensorInfo:
    """Tensor record `i` (its offset still relative to the data section), dims and type checked."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    full = cur.string(f"tensor #{i}'s name")
    name = full[:80]  # in messages
    n_dims = cur.uint("I", f"tensor {name!r}'s dim count")
    if n_dims > MAX_DIMS:
        raise corrupt(cur.path, f"tensor {name!r} declares {n_dims} dims (GGUF allows {MAX_DIMS})")
    dims = [cur.uint("Q", f"tensor {name!r}'s dims") for _ in range(n_dims)]
    qtype = cur.uint("I", f"tensor {name!r}'s type")
    offset = cur.uint("Q", f"tensor {name!r}'s offset")
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise corrupt(
            cur.path, f"tensor {name!r} has quantisation type {qtype}, which gguf does not know"
        ) from None
    if dims and dims[0] % block:
        raise corrupt(
            cur.path, f"tensor {name!r}'s row of {dims[0]} is not a whole number of {block}-blocks"
        )
    n = 1
    for d in dims:  # Python ints: an overflow stays visible
        n *= d
    return TensorInfo(full, tuple(dims), qtype, offset, n // block * type_size)


def _check_data(cur: _Cursor, tensors: list[TensorInfo], start: int) -> int:
    """Every tensor's bytes lie inside the file; returns where the last one ends."""
    size, end = len(cur.buf), start
    for t in tensors:
        name, offset, nbytes = t.name[:80], t.offset, t.nbytes
        if start + offset + nbytes > size:
            raise corrupt(
                cur.path,
                f"tensor {name!r} ({nbytes} bytes at {start + offset}) ends "
                f"past the end of the file ({size} bytes)",
            )
        end = max(end, start + offset + nbytes)
    return end

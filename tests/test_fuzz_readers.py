"""Hostile checkpoint files (issue 34, item 3, tier 1): a GGUF or safetensors file that is
truncated, bit-flipped or declares inflated counts, lengths, dims or offsets either reads or raises
our one-line CorruptFileError / ModelFormatError — never another exception — and never allocates
more than a small multiple of its own size."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dflash_edge.models.checkpoint import Checkpoint
from dflash_edge.models.gguf_check import check_gguf
from dflash_edge.models.gguf_import import (
    architecture,
    build_config,
    build_tokenizer,
    open_gguf,
    read_blocks,
    read_tensors,
)
from dflash_edge.runtime.errors import CorruptFileError, DflashEdgeError

gguf = pytest.importorskip("gguf")
from tiny_gguf import write_tiny_gguf  # noqa: E402

FUZZ = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
# the reader's own objects may cost a few times a small file's bytes (GGUFReader keeps ~1 KB per
# metadata array item); what must never happen is an allocation sized by a declared count (GBs,
# or a loop that never ends)
ALLOWANCE = 64
HUGE = st.sampled_from([2**31, 2**32 - 1, 2**32, 2**40, 2**60, 2**63, 2**64 - 1]) | st.integers(
    0, 2**64 - 1
)
FLIPS = st.tuples(st.integers(0, 2**20), st.integers(0, 7))  # (byte, bit)


def _bounded(read, path: Path) -> DflashEdgeError | None:
    """Run `read(path)`: our named error (one line, naming the file) or None; any other exception
    propagates. The peak of traced allocations is bounded by the file's size either way."""
    error = None
    tracemalloc.start()
    try:
        read(path)
    except DflashEdgeError as err:
        error = err
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    size = path.stat().st_size
    assert peak <= ALLOWANCE * max(size, 1 << 12), f"peak {peak} B for a {size} B file"
    if error is not None:
        assert "\n" not in str(error) and str(path) in str(error), str(error)
    return error


# ---- GGUF ---------------------------------------------------------------------------------


def _read_gguf(path: Path) -> None:
    """The reader: open the file, read every metadata value and every tensor's bytes."""
    reader = open_gguf(path)
    for field in reader.fields.values():
        field.contents()
    for t in reader.tensors:
        assert t.data.nbytes == t.n_bytes  # all of its declared bytes, in the file
        int(np.asarray(t.data).view(np.uint8).sum(dtype=np.uint64))


def _import_gguf(path: Path) -> None:
    """Everything the importer reads from a GGUF before it writes anything."""
    reader = open_gguf(path)
    arch = architecture(reader, path)
    tensors = read_tensors(reader, arch, path)
    read_blocks(reader, arch, path)
    build_config(reader, arch, {n: w.shape for n, w in tensors.items()}, path)
    build_tokenizer(reader, path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(pristine bytes, [(offset, width)] of every count / length / type / dim / offset in its
    header, where its data starts)."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    reader = gguf.GGUFReader(path)
    base = reader.data.ctypes.data
    fields = list(reader.fields.values()) + [t.field for t in reader.tensors]
    numbers = sorted(
        {
            (p.ctypes.data - base, p.dtype.itemsize)
            for f in fields
            for p in f.parts
            if p.dtype.kind == "u" and p.dtype.itemsize in (4, 8) and p.size == 1
        }
    )
    return Sample((path.read_bytes(), numbers, reader.data_offset))


class Sample(tuple):
    """A fixture's tuple that hypothesis prints briefly (the file's bytes are long)."""

    def __repr__(self):
        return f"<{len(self[0])}-byte sample>"


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def test_gguf_pristine_reads_and_checks(tiny, tmp_path):
    data, numbers, start = tiny
    path = _write(tmp_path, "ok.gguf", data)
    summary = check_gguf(path)
    assert summary.tensors == len(gguf.GGUFReader(path).tensors)
    assert summary.data_end == len(data)
    assert len(numbers) > 40  # counts, lengths, dims, types, offsets all found
    _bounded(_read_gguf, path)


@FUZZ
@given(cut=st.floats(0, 1, exclude_max=True))
def test_gguf_truncated(tiny, tmp_path, cut):
    data = tiny[0]
    path = _write(tmp_path, "cut.gguf", data[: int(len(data) * cut)])
    err = _bounded(_read_gguf, path)
    assert isinstance(err, CorruptFileError) and "truncated or corrupt: re-download" in str(err)


@FUZZ
@given(flips=st.lists(FLIPS, min_size=1, max_size=8))
def test_gguf_bit_flips(tiny, tmp_path, flips):
    data, _, start = tiny
    b = bytearray(data)
    for pos, bit in flips:
        b[pos % (start + 64)] ^= 1 << bit  # the header and the start of the data
    _bounded(_read_gguf, _write(tmp_path, "flip.gguf", bytes(b)))


@FUZZ
@given(pick=st.integers(0, 2**16), value=HUGE)
def test_gguf_inflated_numbers(tiny, tmp_path, pick, value):
    data, numbers, _ = tiny
    offset, width = numbers[pick % len(numbers)]
    b = bytearray(data)
    struct.pack_into("<Q" if width == 8 else "<I", b, offset, value % (1 << 8 * width))
    _bounded(_read_gguf, _write(tmp_path, "big.gguf", bytes(b)))


@FUZZ
@given(
    pick=st.integers(0, 2**16), value=HUGE | st.integers(0, 70), flips=st.lists(FLIPS, max_size=4)
)
def test_gguf_import_fuzz(tiny, tmp_path, pick, value, flips):
    """The importer's own reading (architecture, counts, heads, tokenizer) on a damaged header: a
    hostile block_count or head count is named, never a loop sized by it or a ZeroDivisionError."""
    data, numbers, start = tiny
    offset, width = numbers[pick % len(numbers)]
    b = bytearray(data)
    struct.pack_into("<Q" if width == 8 else "<I", b, offset, value % (1 << 8 * width))
    for pos, bit in flips:
        b[pos % (start + 64)] ^= 1 << bit
    _bounded(_import_gguf, _write(tmp_path, "imp.gguf", bytes(b)))


def test_gguf_hostile_block_count_is_named(tiny, tmp_path):
    path = _write(tmp_path, "ok.gguf", tiny[0])
    field = gguf.GGUFReader(path).fields["llama.block_count"]
    b = bytearray(tiny[0])
    struct.pack_into("<I", b, field.offset + 8 + len(field.name) + 4, 2**32 - 1)
    err = _bounded(_import_gguf, _write(tmp_path, "layers.gguf", bytes(b)))
    assert isinstance(err, DflashEdgeError) and "llama.block_count = '4294967295'" in str(err)


@pytest.mark.parametrize(
    "where,value,says",
    [
        (8, 2**60, "declares 1152921504606846976 tensors"),
        (16, 2**60, "metadata keys"),
    ],
)
def test_gguf_inflated_counts_are_named(tiny, tmp_path, where, value, says):
    b = bytearray(tiny[0])
    struct.pack_into("<Q", b, where, value)
    with pytest.raises(CorruptFileError, match=says):
        open_gguf(_write(tmp_path, "big.gguf", bytes(b)))


def test_gguf_endless_array_is_refused(tiny, tmp_path):
    """GGUFReader loops for ever on an array of 2**40 one-byte items (empty views past the end),
    growing memory: read in a child process with a time limit, so a regression fails, not hangs."""
    b = bytearray(tiny[0])
    reader = gguf.GGUFReader(_write(tmp_path, "ok.gguf", tiny[0]))
    field = reader.fields["tokenizer.ggml.token_type"]
    at = field.offset + 8 + len(field.name) + 4  # key length, key, value type
    struct.pack_into("<IQ", b, at, 0, 2**40)  # item type uint8, 2**40 items
    path = _write(tmp_path, "loop.gguf", bytes(b))
    code = (
        "import sys; from pathlib import Path; from dflash_edge.models.gguf_import import "
        "open_gguf; open_gguf(Path(sys.argv[1]))"
    )
    try:
        run = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("open_gguf still reading a 2**40-item array after 60 s")
    assert "CorruptFileError" in run.stderr and "tokenizer.ggml.token_type" in run.stderr
    err = _bounded(_read_gguf, path)
    assert isinstance(err, CorruptFileError) and "2**40" not in str(err)


# ---- safetensors --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    """(bytes of a small model.safetensors, its header as a dict, the arrays it holds)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    arrays = {
        "a.weight": rng.standard_normal((8, 16)).astype(np.float32),
        "b.weight": rng.standard_normal((4, 4)).astype(np.float16),
        "c.bias": rng.standard_normal(24).astype(np.float32),
    }
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    save_file(arrays, str(path), metadata={"format": "pt"})
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return Sample((data, json.loads(data[8 : 8 + n]), arrays))


def _read_checkpoint(path: Path) -> None:
    """Open the folder, read every tensor; what comes back must be what the header declares."""
    ckpt = Checkpoint.open(path.parent)
    for name in ckpt.names():
        assert ckpt.array(name).shape == ckpt.shape(name)


def _raw(header: dict, body: bytes, length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + body


def test_safetensors_pristine(shard, tmp_path):
    data, _, arrays = shard
    path = _write(tmp_path, "model.safetensors", data)
    ckpt = Checkpoint.open(tmp_path)
    for name, want in arrays.items():
        np.testing.assert_array_equal(ckpt.array(name), want.astype(np.float32))
    _bounded(_read_checkpoint, path)


@FUZZ
@given(cut=st.floats(0, 1, exclude_max=True))
def test_safetensors_truncated(shard, tmp_path, cut):
    data = shard[0]
    path = _write(tmp_path, "model.safetensors", data[: int(len(data) * cut)])
    err = _bounded(_read_checkpoint, path)
    assert isinstance(err, CorruptFileError) and "truncated or corrupt: re-download" in str(err)


@FUZZ
@given(flips=st.lists(FLIPS, min_size=1, max_size=8))
def test_safetensors_bit_flips(shard, tmp_path, flips):
    data = shard[0]
    b = bytearray(data)
    header_end = 8 + struct.unpack("<Q", data[:8])[0]
    for pos, bit in flips:
        b[pos % header_end] ^= 1 << bit
    _bounded(_read_checkpoint, _write(tmp_path, "model.safetensors", bytes(b)))


@FUZZ
@given(pick=st.integers(0, 2**16), value=HUGE, length=st.booleans())
def test_safetensors_inflated_numbers(shard, tmp_path, pick, value, length):
    data, header, _ = shard
    body = data[8 + struct.unpack("<Q", data[:8])[0] :]
    h = json.loads(json.dumps(header))
    slots = [
        (n, k, i)
        for n, e in h.items()
        if n != "__metadata__"
        for k in ("shape", "data_offsets")
        for i in range(len(e[k]))
    ]
    name, key, i = slots[pick % len(slots)]
    if length:  # the header's own length
        assume(value != len(json.dumps(h)))
        raw = _raw(h, body, value)
    else:
        assume(value != h[name][key][i])
        h[name][key][i] = value
        raw = _raw(h, body)
    path = _write(tmp_path, "model.safetensors", raw)
    err = _bounded(_read_checkpoint, path)
    assert isinstance(err, CorruptFileError) and "truncated or corrupt: re-download" in str(err)

"""A GGUF file read as a checkpoint, tensor by tensor, with no float32 copy of the model.

`open_gguf(path)` gives what the exporter and parity's torch reference read from a checkpoint
folder (`Checkpoint`: names, shapes, float32 `array`, the exact low-bit operands `nbits`), under
Hugging Face names, Q/K rows un-permuted (models/gguf_import.py's table and helpers), plus a small
folder with `config.json`, the tokenizer and the generation config built as the importer builds
them: never the weights. Each read takes only the bytes of that tensor (or of the rows asked for)
from the file, at the caller's precision: exact blocks for int4/int8, dequantised rows for fp32 /
fp16; nothing of it stays resident after the caller drops it.

    >>> ckpt, folder = open_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
    >>> ckpt.shape("model.embed_tokens.weight"), folder.name  # doctest: +SKIP
    ((49152, 576), 'SmolLM2-135M-Instruct.Q4_1-<key>')
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..runtime.errors import CorruptFileError, ModelFormatError
from ..runtime.publish import publish_dir
from .checkpoint import lookup
from .fetch import cache_home
from .gguf_check import check_gguf
from .gguf_import import (
    GGUF_MAGIC,
    architecture,
    block_weight,
    build_config,
    build_tokenizer,
    check_tensor_table,
    float_weight,
    hf_row_order,
    hf_tensor_name,
    is_low_bit,
    rotary_heads,
    write_config_files,
)
from .gguf_import import open_gguf as gguf_reader

CONFIGS = "gguf"  # cache_home()/gguf/<stem>-<key>: the small files of each GGUF used as a target
SOURCE = "SOURCE.json"  # the folder's record: the file, its architecture, Q/K head counts
FOLDER_VERSION = 1  # of what the folder holds (part of its name)


def open_gguf(path) -> tuple["GgufCheckpoint", Path]:
    """(checkpoint over the file's tensors, folder of its config.json + tokenizer files); a bad
    file raises one ModelFormatError / CorruptFileError naming the problem. The metadata is parsed
    (gguf.GGUFReader) only when that folder is built; the tensor table always comes from the
    bounded header walk (models/gguf_check.py).

    >>> ckpt, folder = open_gguf("model.gguf")  # doctest: +SKIP
    """
    path = Path(path).expanduser()
    folder = config_dir(path)
    record = json.loads((folder / SOURCE).read_text(encoding="utf-8"))
    table = _tensor_table(check_gguf(path).table, path)
    return GgufCheckpoint(path, table, record["rotary_heads"]), folder


def is_gguf(spec) -> bool:
    """Whether a target spec names a GGUF file: a `.gguf` path (existing or not: opening it names
    what is wrong), or an existing file that starts with the GGUF magic."""
    if spec is None:
        return False
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        return True
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC


def config_dir(path: Path) -> Path:
    """The folder of `path`'s config.json, tokenizer.json, tokenizer_config.json and
    generation_config.json (what `import_gguf` writes beside the weights) and SOURCE.json (the
    architecture, the Q/K head counts), built once per file version (path, size, mtime) in
    `cache_home()/gguf/`, after every check the importer makes."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelFormatError(f"GGUF file {path} does not exist; pass the path of a .gguf file.")
    out = _cache_folder(path)
    if (out / SOURCE).is_file():
        return out
    reader = gguf_reader(path)  # bounded header walk first (models/gguf_check.py)
    arch = architecture(reader, path)
    check_tensor_table(reader, arch, path)
    shapes = {hf_tensor_name(t.name, path): _np_shape(t) for t in reader.tensors}
    config = build_config(reader, arch, shapes, path)
    tokenizer = build_tokenizer(reader, path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write_config_files(tmp, reader, path, config, tokenizer)
        record = {
            "gguf_file": str(path.resolve()),
            "weights": "read from the GGUF at export",
            "architecture": arch,
            "rotary_heads": rotary_heads(reader, arch, path),
        }
        (tmp / SOURCE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        publish_dir(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _cache_folder(path: Path) -> Path:
    stat = path.stat()
    key = f"{FOLDER_VERSION}|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    return cache_home() / CONFIGS / f"{path.stem}-{hashlib.sha256(key).hexdigest()[:16]}"


@dataclass(frozen=True)
class _Tensor:
    gguf_name: str
    qtype: str  # GGUF type name: F32, F16, Q4_1, ...
    shape: tuple[int, ...]  # numpy order ([out, in]), GGUF's reversed dims undone
    offset: int  # absolute byte offset of its data in the file
    nbytes: int

    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) == 2 else 1

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.rows


def _np_shape(t) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(t.shape.tolist()))


def _tensor_table(table, path: Path) -> dict[str, _Tensor]:
    """HF name -> where its bytes are (`table`: gguf_check's checked tensor records)."""
    from gguf import GGMLQuantizationType

    return {
        hf_tensor_name(t.name, path): _Tensor(
            t.name,
            GGMLQuantizationType(t.qtype).name,
            tuple(reversed(t.dims)),
            t.offset,
            t.nbytes,
        )
        for t in table
    }


class GgufCheckpoint:
    """The `Checkpoint` interface over a GGUF file's tensors: every tensor is float32 to `array`
    (dequantised as llama.cpp computes with it), low-bit ones also exact blocks to `nbits`."""

    def __init__(self, path: Path, tensors: dict[str, _Tensor], heads: dict[str, int]):
        self.root, self.tensors, self.heads = path, tensors, heads

    def names(self) -> list[str]:
        return list(self.tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name].shape

    def dtype(self, name: str) -> str:
        return "F32"  # what `array` and `get` give

    @property
    def nbytes(self) -> int:
        """Bytes of all tensors as stored in the file."""
        return sum(t.nbytes for t in self.tensors.values())

    def num_params(self, skip: tuple[str, ...] = ()) -> int:
        return sum(_numel(t.shape) for n, t in self.tensors.items() if n not in skip)

    def check_dtypes(self, declared: str | None) -> None:
        """Every tensor comes out as float32, what the derived config.json declares."""
        if str(declared or "float32").removeprefix("torch.") != "float32":
            raise ModelFormatError(
                f"{self.root}: config torch_dtype {declared!r}: a GGUF's tensors are read as "
                "float32; use the config.json open_gguf writes"
            )

    def array(self, name: str, shape: tuple[int, ...] | None = None, rows: slice | None = None):
        """One tensor (or `rows` of its first axis) dequantised to float32, in HF row order."""
        import numpy as np

        t = self._entry(name, shape)
        if len(t.shape) != 2:  # norms and biases: small, read whole
            w = float_weight(self._raw(t, 0, 1), t.qtype, t.gguf_name, {}, self.root)
            return w.reshape(t.shape)[rows or slice(None)]
        start, stop, _ = (rows or slice(None)).indices(t.rows)
        if stop <= start:
            return np.zeros((0, *t.shape[1:]), np.float32)
        order = hf_row_order(t.gguf_name, t.rows, self.heads, self.root)
        if order is None:
            raw = self._raw(t, start, stop)
        else:  # Q/K: llama.cpp's row order, small enough to read whole
            raw = self._raw(t, 0, t.rows)[order[start:stop]]
        return float_weight(raw, t.qtype, t.gguf_name, {}, self.root)

    def get(self, name: str):
        """One tensor as a float32 torch tensor (models/weights.load_streamed)."""
        import torch

        return torch.from_numpy(self.array(name))

    def nbits(self, name: str):
        """Weight `name`'s exact MatMulNBits operands (models/nbits.NBitsWeight) when it is a
        low-bit tensor of a mapped type, else None (a float weight only)."""
        from .gguf_blocks import TYPES

        t = self.tensors.get(name)
        if t is None or not is_low_bit(t.qtype, t.shape) or t.qtype not in TYPES:
            return None
        return block_weight(self._raw(t, 0, t.rows), t.qtype, t.gguf_name, self.heads, self.root)

    def unmapped_low_bit(self) -> dict[str, str]:
        """{weight: GGUF type} of the low-bit tensors with no exact mapping (re-quantised)."""
        from .gguf_blocks import TYPES

        return {
            n: t.qtype
            for n, t in self.tensors.items()
            if is_low_bit(t.qtype, t.shape) and t.qtype not in TYPES
        }

    def close(self) -> None:
        """Nothing is held open between reads."""

    def _entry(self, name: str, shape) -> _Tensor:
        return lookup(self.root, self.tensors, name, shape)

    def _raw(self, t: _Tensor, start: int, stop: int):
        """Rows [start, stop) of `t` as bytes [rows, bytes per row], read into private memory
        (np.fromfile: pages of a kept memory map would stay resident for the whole export)."""
        import numpy as np

        count = (stop - start) * t.row_bytes
        raw = np.fromfile(self.root, np.uint8, count=count, offset=t.offset + start * t.row_bytes)
        if raw.size != count:  # the file changed since its header was checked
            raise CorruptFileError.at(
                self.root, f"tensor {t.gguf_name!r} ends past the end of the file"
            )
        return raw.reshape(stop - start, t.row_bytes)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n

"""A checkpoint folder as its publisher ships it, read lazily, one tensor at a time.

Either one `model.safetensors` or shards listed in `model.safetensors.index.json` (what
`save_pretrained` writes above its shard size). Only headers are read up front; `get(name)` reads one
tensor in the checkpoint's own dtype, so loading never holds a second full copy of the model.

>>> ckpt = Checkpoint.open("Qwen3-8B/")                        # doctest: +SKIP
>>> ckpt.shape("model.embed_tokens.weight"), ckpt.dtype("model.norm.weight")   # doctest: +SKIP
((151936, 4096), 'BF16')
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dflash_edge.runtime.errors import ModelFormatError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FLOAT_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
# config.json's torch_dtype (transformers >= 5: `dtype`) -> safetensors dtype
CONFIG_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


@dataclass
class _Entry:
    shard: Path
    dtype: str
    shape: tuple[int, ...]


class Checkpoint:
    """Tensor name -> (shard, dtype, shape) from the files' headers; tensors read on demand."""

    def __init__(self, root: Path, entries: dict[str, _Entry]):
        self.root, self.entries = root, entries
        self._handles: dict[Path, object] = {}

    @classmethod
    def open(cls, root: str | Path) -> "Checkpoint":
        """Index every tensor of `root` (sharded or single file); bad layouts raise ModelFormatError."""
        root = Path(root).expanduser()
        if (root / INDEX).is_file():
            return cls(root, _indexed_entries(root))
        if (root / SINGLE).is_file():
            return cls(root, _shard_entries(root / SINGLE))
        raise ModelFormatError(f"{root} holds neither {SINGLE} nor {INDEX}: a checkpoint folder needs its "
                               f"safetensors weights (re-download it, or save it with save_pretrained)")

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

    def close(self) -> None:
        self._handles.clear()

    def check_dtypes(self, declared: str | None) -> None:
        """Every tensor is a float, and of `declared` (config.json's torch_dtype) when the config names one."""
        want = CONFIG_DTYPES.get(str(declared or "").removeprefix("torch."))
        bad = [f"{n} ({e.dtype})" for n, e in self.entries.items()
               if e.dtype not in FLOAT_DTYPES or (want and e.dtype != want)]
        if bad:
            hint = (f"config.json declares torch_dtype {declared!r}; fix torch_dtype or re-save the weights in it"
                    if want else "quantised checkpoints are not supported: use the float (bf16/fp16/fp32) release")
            raise ModelFormatError(f"{self.root}: tensor dtype does not match: {_preview(bad)}; {hint}")


def _indexed_entries(root: Path) -> dict[str, _Entry]:
    try:
        weight_map = json.loads((root / INDEX).read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ModelFormatError(f"{root / INDEX} is not a safetensors index (no readable weight_map: {err}); "
                               f"re-download it") from err
    shards = sorted(set(weight_map.values()))
    missing = [s for s in shards if not (root / s).is_file()]
    if missing:
        raise ModelFormatError(f"{root / INDEX} lists shard(s) {_preview(missing)} that are not in {root}; "
                               f"the download is incomplete: fetch the missing files")
    entries: dict[str, _Entry] = {}
    for shard in shards:
        entries.update(_shard_entries(root / shard))
    absent = [f"{n} (in {s})" for n, s in weight_map.items() if n not in entries or entries[n].shard.name != s]
    if absent:
        raise ModelFormatError(f"{root / INDEX} names tensor(s) no listed shard holds: {_preview(absent)}; "
                               f"the index and the shards disagree: re-download the checkpoint")
    return {n: entries[n] for n in weight_map}


def _shard_entries(path: Path) -> dict[str, _Entry]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            out = {}
            for name in f.keys():
                sl = f.get_slice(name)
                out[name] = _Entry(path, sl.get_dtype(), tuple(sl.get_shape()))
            return out
    except (SafetensorError, OSError, ValueError) as err:
        raise ModelFormatError(f"{path} is not a readable safetensors file ({err}); it may be truncated: "
                               f"re-create or re-download it") from err


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _preview(items: list[str], n: int = 6) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more

"""Fill a module from a checkpoint tensor by tensor, with errors that name each bad tensor.

The module is built on the meta device (no memory, no random init), every name and shape is checked
against the checkpoint's headers before any data is read, then each parameter is read, cast to the
requested dtype and set: peak memory is the model plus one tensor. `stream_layers` goes further: a
layer's weights are read when it runs and dropped after it, so only one layer is ever in memory.

>>> ckpt = Checkpoint.open(path)  # doctest: +SKIP
>>> model = load_streamed(lambda: TargetModel(cfg, spec), ckpt, torch.float32)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .checkpoint import Checkpoint, check_shapes


def check_names(module: nn.Module, ckpt: Checkpoint, ignore: tuple[str, ...] = ()) -> list[str]:
    """The names to load; missing, misshaped and unexpected tensors are all listed in one error."""
    return check_shapes(
        {k: tuple(v.shape) for k, v in module.state_dict().items() if k not in ignore}, ckpt, ignore
    )


def _set(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    owner, _, attr = name.rpartition(".")
    setattr(
        model.get_submodule(owner),
        attr,
        nn.Parameter(tensor, requires_grad=tensor.is_floating_point()),
    )


def load_streamed(
    build: Callable[[], nn.Module],
    ckpt: Checkpoint,
    dtype: torch.dtype,
    ignore: tuple[str, ...] = (),
) -> nn.Module:
    """`build()` on the meta device, then every parameter read from `ckpt` in `dtype`, one at a
    time."""
    with torch.device("meta"):
        model = build()
    for name in check_names(model, ckpt, ignore):
        # no copy when the checkpoint is already in `dtype`
        _set(model, name, ckpt.get(name).to(dtype))
    ckpt.close()
    return model


def stream_layers(
    build: Callable[[], nn.Module],
    ckpt: Checkpoint,
    layers: str,
    dtype: torch.dtype = torch.float32,
    ignore: tuple[str, ...] = (),
) -> nn.Module:
    """`build()` on the meta device with every tensor outside `layers` (a ModuleList's name) loaded,
    and each layer's own read when it runs (forward pre-hook) and dropped back to meta after it
    (forward hook). A ModuleList inside a layer (a mixture-of-experts MLP's `experts`) streams the
    same way, item by item: an expert is read only if a token chose it, and one at a time.

    >>> model = stream_layers(  # doctest: +SKIP
    ...     lambda: TargetModel(cfg, spec), ckpt, "model.layers")
    """
    with torch.device("meta"):
        model = build()
    names = check_names(model, ckpt, ignore)
    for name in names:
        if not name.startswith(f"{layers}."):
            _set(model, name, _read(ckpt, name, dtype))
    for i, layer in enumerate(model.get_submodule(layers)):
        own = [n for n in names if n.startswith(f"{layers}.{i}.")]
        for inner, items in layer.named_modules(prefix=f"{layers}.{i}"):
            if isinstance(items, nn.ModuleList):
                for j, item in enumerate(items):
                    mine = [n for n in own if n.startswith(f"{inner}.{j}.")]
                    own = [n for n in own if not n.startswith(f"{inner}.{j}.")]
                    _stream(item, model, ckpt, mine, dtype)
        _stream(layer, model, ckpt, own, dtype)
    return model


def _stream(
    module: nn.Module, model: nn.Module, ckpt: Checkpoint, names: list[str], dtype: torch.dtype
) -> None:
    module.register_forward_pre_hook(_loader(model, ckpt, names, dtype))
    module.register_forward_hook(_dropper(model, ckpt, names))


def _loader(model: nn.Module, ckpt: Checkpoint, names: list[str], dtype: torch.dtype):
    def load(*_):
        for name in names:
            _set(model, name, _read(ckpt, name, dtype))

    return load


def _read(ckpt: Checkpoint, name: str, dtype: torch.dtype) -> torch.Tensor:
    """One tensor read into private memory (np.fromfile, not a memory map: touched pages of a mapped
    shard would stay resident for as long as its handle is open)."""
    return torch.from_numpy(ckpt.array(name)).to(dtype)


def _dropper(model: nn.Module, ckpt: Checkpoint, names: list[str]):
    def drop(*_):
        for name in names:
            _set(model, name, torch.empty(ckpt.shape(name), device="meta"))

    return drop


class RowEmbedding(nn.Module):
    """An embedding that reads the rows it looks up from the checkpoint (one read per distinct id)
    instead of holding the [V, H] table: an untied 151,936 x 2,048 table is 1.2 GB in float32. For
    references that look up a few dozen tokens (export parity)."""

    def __init__(self, ckpt, name: str, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.ckpt, self.name, self.dtype = ckpt, name, dtype
        self.num_embeddings, self.embedding_dim = ckpt.shape(name)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).tolist()
        if flat and not 0 <= min(flat) <= max(flat) < self.num_embeddings:
            raise IndexError(
                f"token ids {min(flat)}..{max(flat)} outside {self.name}'s {self.num_embeddings} "
                "rows"
            )
        rows = {
            i: torch.from_numpy(self.ckpt.array(self.name, rows=slice(i, i + 1))[0])
            for i in set(flat)
        }
        out = torch.stack([rows[i] for i in flat]) if flat else torch.empty(0, self.embedding_dim)
        return out.to(self.dtype).view(*ids.shape, self.embedding_dim)  # [..., H]


def still_meta(model: nn.Module) -> list[str]:
    """Names of tensors no checkpoint tensor filled (a bug in the loader if non-empty)."""
    return [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]

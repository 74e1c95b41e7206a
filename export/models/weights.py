"""Fill a module from a checkpoint tensor by tensor, with errors that name each bad tensor.

The module is built on the meta device (no memory, no random init), every name and shape is checked
against the checkpoint's headers before any data is read, then each parameter is read, cast to the
requested dtype and set: peak memory is the model plus one tensor.

>>> model = load_streamed(lambda: TargetModel(cfg, spec), Checkpoint.open(path), torch.float32)  # doctest: +SKIP
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from dflash_edge.runtime.errors import ModelFormatError

from .checkpoint import Checkpoint, _preview


def check_names(module: nn.Module, ckpt: Checkpoint, ignore: tuple[str, ...] = ()) -> list[str]:
    """The names to load; missing, misshaped and unexpected tensors are all listed in one error."""
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items() if k not in ignore}
    have = set(ckpt.names())
    missing = sorted(set(expected) - have)
    unexpected = sorted(have - set(expected) - set(ignore))
    misshaped = [f"{k}: file {ckpt.shape(k)} vs model {shape}" for k, shape in expected.items()
                 if k in have and ckpt.shape(k) != shape]
    problems = [f"{what} tensors {_preview(items)}" for what, items in
                (("missing", missing), ("misshaped", misshaped), ("unexpected", unexpected)) if items]
    if problems:
        raise ModelFormatError(f"{ckpt.root}: " + "; ".join(problems) + " — the weights do not match config.json")
    return list(expected)


def load_streamed(build: Callable[[], nn.Module], ckpt: Checkpoint, dtype: torch.dtype,
                  ignore: tuple[str, ...] = ()) -> nn.Module:
    """`build()` on the meta device, then every parameter read from `ckpt` in `dtype`, one at a time."""
    with torch.device("meta"):
        model = build()
    for name in check_names(model, ckpt, ignore):
        owner, _, attr = name.rpartition(".")
        tensor = ckpt.get(name).to(dtype)           # no copy when the checkpoint is already in `dtype`
        setattr(model.get_submodule(owner), attr, nn.Parameter(tensor, requires_grad=tensor.is_floating_point()))
    ckpt.close()
    return model


def still_meta(model: nn.Module) -> list[str]:
    """Names of tensors no checkpoint tensor filled (a bug in the loader if non-empty)."""
    return [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]

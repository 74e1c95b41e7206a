"""Load and save module weights from safetensors with errors that name each bad tensor."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from dflash_edge.runtime.errors import ModelFormatError


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of one file; a missing or truncated file raises ModelFormatError naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists():
        raise ModelFormatError(f"weights file {path} not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise ModelFormatError(f"{path} is not a readable safetensors file ({err}); it may be truncated: "
                               f"re-create or re-download it") from err


def load_checked(module: nn.Module, tensors: dict[str, torch.Tensor], source: str,
                 ignore: tuple[str, ...] = ()) -> None:
    """Copy `tensors` into `module`, first checking every name and shape against the module.

    Missing, misshaped and unexpected tensors are all listed in one error.
    """
    expected = {k: v for k, v in module.state_dict().items() if k not in ignore}
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected) - set(ignore))
    misshaped = [f"{k}: file {tuple(tensors[k].shape)} vs model {tuple(v.shape)}"
                 for k, v in expected.items() if k in tensors and tensors[k].shape != v.shape]
    problems = []
    if missing:
        problems.append(f"missing tensors {_preview(missing)}")
    if misshaped:
        problems.append(f"misshaped tensors {_preview(misshaped)}")
    if unexpected:
        problems.append(f"unexpected tensors {_preview(unexpected)}")
    if problems:
        raise ModelFormatError(f"{source}: " + "; ".join(problems) + " — the weights do not match config.json")
    with torch.no_grad():
        for name, value in expected.items():
            value.copy_(tensors[name].to(value.dtype))


def _preview(items: list[str], n: int = 6) -> str:
    more = f" (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more

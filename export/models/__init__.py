"""Torch reference targets, one file per family; the file name is the config's `model_type`.

>>> from dflash_edge.export.models import load_target      # doctest: +SKIP
>>> target = load_target("~/.cache/dflash-edge/models/smollm2-135m-instruct")  # doctest: +SKIP
"""
from __future__ import annotations

import importlib
from pathlib import Path

from dflash_edge.runtime.errors import ModelFormatError

from .config import TargetConfig

# model_type -> module in this package defining `attention_spec(cfg) -> AttentionSpec`.
FAMILIES = ("llama", "qwen2", "qwen3")


def build_target(cfg: TargetConfig):
    """A randomly initialised TargetModel for `cfg` (weights are loaded by `load_target`)."""
    from .target import TargetModel

    if cfg.model_type not in FAMILIES:
        raise ModelFormatError(f"model_type {cfg.model_type!r} is not supported; supported: {', '.join(FAMILIES)}")
    family = importlib.import_module(f"{__name__}.{cfg.model_type}")
    return TargetModel(cfg, family.attention_spec(cfg))


def load_target(path: str | Path, dtype=None):
    """Build the target from `path/config.json` and load `path/model.safetensors` (float32 by default)."""
    import torch

    from .weights import load_checked, read_safetensors

    path = Path(path).expanduser()
    cfg = TargetConfig.from_json(path)
    model = build_target(cfg)
    ignore = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    load_checked(model, read_safetensors(path / "model.safetensors"), str(path / "model.safetensors"), ignore)
    return model.to(dtype or torch.float32).eval()

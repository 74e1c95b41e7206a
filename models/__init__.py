"""What a checkpoint is (floor 3): configs, families (models/families/: one module per family, its
file name the config's `model_type`), safetensors / GGUF readers, fetch, the torch reference models
(target and z-lab drafter) and the reference loop that export's parity, train and the tests check
against.
GGUF low-bit blocks map exactly onto onnxruntime MatMulNBits operands in `gguf_blocks` (issue 27).

>>> from dflash_edge.models import load_target      # doctest: +SKIP
>>> target = load_target("~/.cache/dflash-edge/models/smollm2-135m-instruct")  # doctest: +SKIP
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from ..runtime.errors import ModelFormatError
from . import dense_family
from .checkpoint import Checkpoint
from .config import TargetConfig
from .families import family


def family_spec(cfg: TargetConfig):
    """The family's `AttentionSpec` for `cfg` (torch-free: the streamed graphs read it too)."""
    return family(cfg.model_type).attention_spec(cfg)


def layer_mlps(cfg: TargetConfig) -> tuple:
    """Per decoder layer: the family's sparse-MLP spec (spec.MoESpec), or None where it is dense."""
    return family(cfg.model_type).mlp_specs(cfg)


def planner_dims(cfg: TargetConfig | dict | str | Path):
    """The planner's dims (devices.dims.ModelDims) of a config, config.json dict or checkpoint.

    >>> planner_dims("models/smollm2-135m-instruct").num_layers # doctest: +SKIP
    30
    """
    if isinstance(cfg, dict):
        cfg = TargetConfig.from_dict(cfg)
    elif not isinstance(cfg, TargetConfig):
        cfg = TargetConfig.from_json(Path(cfg).expanduser())
    return family(cfg.model_type).planner_dims(cfg)


def build_target(cfg: TargetConfig):
    """The family's torch reference for `cfg`, random (`load_target` loads the weights)."""
    return family(cfg.model_type).reference(cfg)


def load_target(path: str | Path, dtype=None):
    """Build the target from `path/config.json` and stream in its safetensors (one file or shards +
    index).

    `dtype` defaults to float32; pass "checkpoint" to keep the checkpoint's dtype (bf16/fp16: no
    fp32 copy)."""
    import torch

    from .weights import load_streamed

    path = Path(path).expanduser()
    cfg = TargetConfig.from_json(path)
    if family(cfg.model_type).reference is not dense_family.reference:
        raise ModelFormatError(
            f"model_type {cfg.model_type!r} has its own torch reference (models/families/"
            f"{cfg.model_type}.py: reference), not the dense TargetModel load_target fills"
        )
    ckpt = Checkpoint.open(path)
    ckpt.check_dtypes(cfg.torch_dtype)
    dtype = checkpoint_dtype(ckpt) if dtype == "checkpoint" else dtype or torch.float32
    ignore = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    model = load_streamed(lambda: build_target(cfg), ckpt, dtype, ignore)
    model.tie_weights()
    return model.to(dtype).eval()  # params are already `dtype`: this casts only the rope tables


def checkpoint_dtype(ckpt):
    """The torch dtype most of a checkpoint's tensors are stored in (float32 when that is not a
    float)."""

    import torch

    names = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    most = Counter(ckpt.dtype(n) for n in ckpt.names()).most_common(1)[0][0]
    return names.get(most, torch.float32)

"""What a checkpoint is (floor 3): configs, families as data (one file per family, the file name is the config's
`model_type`), safetensors / GGUF readers, fetch, the torch reference models (target and z-lab drafter) and the
reference loop that export's parity, train and the tests check against.
GGUF low-bit blocks map exactly onto onnxruntime MatMulNBits operands in `gguf_blocks` (issue 27).

>>> from dflash_edge.models import load_target      # doctest: +SKIP
>>> target = load_target("~/.cache/dflash-edge/models/smollm2-135m-instruct")  # doctest: +SKIP
"""
from __future__ import annotations

import importlib
from pathlib import Path

from dflash_edge.runtime.errors import ModelFormatError

from .config import TargetConfig

# model_type -> module in this package defining `attention_spec(cfg) -> AttentionSpec` (and, for a family with
# sparse layers, `mlp_specs(cfg)`: per layer a MoESpec or None). A hybrid family (HYBRID: linear-attention layers,
# models/linear_attention.py) is exported as `target_hybrid` and has no dense TargetModel.
FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe", "qwen3_5")
HYBRID = ("qwen3_5",)


def family_spec(cfg: TargetConfig):
    """The family's `AttentionSpec` for `cfg` (torch-free: the streamed graphs read it too)."""
    if cfg.model_type not in FAMILIES:
        raise ModelFormatError(f"model_type {cfg.model_type!r} is not supported; supported: {', '.join(FAMILIES)}")
    return importlib.import_module(f"{__name__}.{cfg.model_type}").attention_spec(cfg)


def layer_mlps(cfg: TargetConfig) -> tuple:
    """Per decoder layer: the family's sparse-MLP spec (models/qwen3_moe.MoESpec), or None where the MLP is dense."""
    family_spec(cfg)                                   # an unknown family is refused by name first
    module = importlib.import_module(f"{__name__}.{cfg.model_type}")
    return module.mlp_specs(cfg) if hasattr(module, "mlp_specs") else (None,) * cfg.num_hidden_layers


def build_target(cfg: TargetConfig):
    """A randomly initialised TargetModel for `cfg` (weights are loaded by `load_target`)."""
    from .target import TargetModel

    if cfg.model_type in HYBRID:
        raise ModelFormatError(f"model_type {cfg.model_type!r} is a hybrid (linear-attention) target: its torch "
                               f"reference is models/linear_attention.load_hybrid, not the dense TargetModel")
    return TargetModel(cfg, family_spec(cfg), layer_mlps(cfg))


def load_target(path: str | Path, dtype=None):
    """Build the target from `path/config.json` and stream in its safetensors (one file or shards + index).

    `dtype` defaults to float32; pass "checkpoint" to keep the checkpoint's dtype (bf16/fp16: no fp32 copy).
    """
    import torch

    from .checkpoint import Checkpoint
    from .weights import load_streamed

    path = Path(path).expanduser()
    cfg = TargetConfig.from_json(path)
    ckpt = Checkpoint.open(path)
    ckpt.check_dtypes(cfg.torch_dtype)
    dtype = checkpoint_dtype(ckpt) if dtype == "checkpoint" else dtype or torch.float32
    ignore = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    model = load_streamed(lambda: build_target(cfg), ckpt, dtype, ignore)
    model.tie_weights()
    return model.to(dtype).eval()          # params are already `dtype`: this casts only the rope tables


def checkpoint_dtype(ckpt):
    """The torch dtype most of a checkpoint's tensors are stored in (float32 when that is not a float)."""
    from collections import Counter

    import torch

    names = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    most = Counter(ckpt.dtype(n) for n in ckpt.names()).most_common(1)[0][0]
    return names.get(most, torch.float32)

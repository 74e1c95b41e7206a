"""Qwen3-MoE family (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): qwen3's attention, and in the sparse
layers a router plus `num_experts` SwiGLU experts of which `num_experts_per_tok` run per token.
Torch-free: the streamed graph writers read these specs and names too; the torch layer is
models/moe.py, the ONNX one export/moe_layers.py. No GGUF import (gguf_import reads dense llama.cpp
files only).

Published layout (what transformers 5's `save_pretrained` writes too), per sparse layer N and expert
E: `model.layers.N.mlp.gate.weight` [E, H] (the router) and
`model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight`. Dense layers (`mlp_only_layers`, or off
the `decoder_sparse_step` grid) keep `mlp.{gate,up,down}_proj.weight` of width `intermediate_size`.

>>> from dflash_edge.models.config import TargetConfig
>>> cfg = TargetConfig.from_dict({"model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32,
...     "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_experts": 8,
...     "num_experts_per_tok": 2, "moe_intermediate_size": 16, "mlp_only_layers": [1]})
>>> [m and m.num_experts for m in mlp_specs(cfg)]
[8, None, 8]
"""

from __future__ import annotations

import re

from ...runtime.errors import ModelFormatError
from ..dense_family import *  # noqa: F403  (the dense interface; below, what differs)
from ..names import moe_tensors  # noqa: F401
from ..spec import MoESpec
from .qwen3 import attention_spec  # noqa: F401  (qwen3's attention: per-head q/k RMSNorm)


def mlp_specs(cfg) -> tuple[MoESpec | None, ...]:
    """Per decoder layer: its MoESpec, or None for a dense MLP of width `intermediate_size`
    (transformers' rule)."""
    if not cfg.num_experts:
        return (None,) * cfg.num_hidden_layers
    if cfg.moe_intermediate_size <= 0:
        raise ModelFormatError(
            f"config.json num_experts={cfg.num_experts} but moe_intermediate_size="
            f"{cfg.moe_intermediate_size}: each expert's width is needed; fix config.json"
        )
    spec = MoESpec(
        cfg.hidden_size,
        cfg.num_experts,
        cfg.num_experts_per_tok,
        cfg.moe_intermediate_size,
        bool(cfg.norm_topk_prob),
    )
    step = max(cfg.decoder_sparse_step, 1)
    return tuple(
        None if i in cfg.mlp_only_layers or (i + 1) % step else spec
        for i in range(cfg.num_hidden_layers)
    )


def manifest_fields(cfg) -> dict:
    """The bundle manifest's `model` keys of an MoE target (none for a dense one), what the planner
    needs to count every expert in memory and only the chosen ones per token: experts, chosen per
    token, each one's width, the dense layers' width and which layers are sparse."""
    specs = mlp_specs(cfg)
    sparse = [i for i, m in enumerate(specs) if m is not None]
    if not sparse:
        return {}
    return {
        "num_experts": cfg.num_experts,
        "experts_per_token": cfg.num_experts_per_tok,
        "moe_intermediate_size": cfg.moe_intermediate_size,
        "intermediate_size": cfg.intermediate_size,
        "sparse_layers": sparse,
    }


_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.")


def check_tensors(cfg, names) -> None:
    """A checkpoint whose experts per layer disagree with config.json's `num_experts`: say so with
    both counts (before the per-tensor check lists every missing or unexpected expert tensor)."""
    if not cfg.num_experts:
        return
    found: dict[int, set[int]] = {}
    for name in names:
        hit = _EXPERT.match(name)
        if hit:
            found.setdefault(int(hit[1]), set()).add(int(hit[2]))
    for layer, spec in enumerate(mlp_specs(cfg)):
        have = found.get(layer, set())
        if spec is not None and have and len(have) != spec.num_experts:
            raise ModelFormatError(
                f"model.layers.{layer}.mlp.experts holds {len(have)} experts (ids {min(have)}.."
                f"{max(have)}) but config.json num_experts={spec.num_experts}; the config and the "
                f"weights are from different models"
            )
        if spec is None and have:
            raise ModelFormatError(
                f"model.layers.{layer}.mlp.experts.{min(have)} is in the checkpoint but "
                "config.json "
                f"makes layer {layer} dense (mlp_only_layers={cfg.mlp_only_layers}, "
                f"decoder_sparse_step={cfg.decoder_sparse_step}); fix config.json"
            )

"""qwen3_moe: written like a dense target; a sparse layer's MLP is a router plus experts, read
as a Gather of the chosen ones (portable) or onnxruntime's MoE / QMoE (fused): moe_layers.py."""

from __future__ import annotations

from functools import partial

from ...models.families import family
from ..dense_writers import dense_writers
from ..moe_layers import moe_fused, moe_gather
from ..portable_layers import mlp
from ..target_job import MlpWriters, TargetJob


def mlp_writers(cfg) -> tuple[MlpWriters, ...]:
    """Per layer: the experts' writers where models' mlp_specs gives a MoESpec, else dense."""
    return tuple(
        MlpWriters(mlp, mlp)
        if m is None
        else MlpWriters(partial(_experts, moe_gather, m), partial(_experts, moe_fused, m))
        for m in family(cfg.model_type).mlp_specs(cfg)
    )


def target_writers(job: TargetJob) -> dict:
    """The dense target's two graphs, each sparse layer's MLP by this family's expert writers."""
    return dense_writers(job, mlp_writers(job.tc))


def _experts(write, m, g, h: str, layer) -> str:
    return write(g, h, layer.ckpt, layer.prefix, m)  # [1, T, H]

"""A dense target's graph writers as a family hands them out: the portable and the fused target,
each layer's MLP writer given up front (target_job.MlpWriters)."""

from __future__ import annotations

from .fused_target import build_fused_target
from .portable_layers import mlp
from .portable_target import build_target
from .target_job import MlpWriters, TargetJob


def dense_mlps(cfg) -> tuple[MlpWriters, ...]:
    """Every layer's MLP is the dense SwiGLU (portable_layers.mlp) in both flavours."""
    return (MlpWriters(mlp, mlp),) * cfg.num_hidden_layers


def dense_writers(job: TargetJob, mlps: tuple[MlpWriters, ...] | None = None) -> dict:
    """A dense target's graphs: the portable one and the fused (GroupQueryAttention) one; `mlps`:
    the family's per-layer MLP writers (default: every layer dense)."""
    mlps = mlps or dense_mlps(job.tc)
    return {
        "target": lambda p: build_target(job, p, mlps),
        "target_fused": lambda p: build_fused_target(job, p, mlps),
    }

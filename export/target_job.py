"""What a family's target graph writers receive (export/families/<model_type>.py), one signature.

>>> writers = family_writers(tc.model_type).target_writers(job)    # doctest: +SKIP
>>> writers["target"](Path("b/target.onnx"))                       # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from .fused_target import build_fused_target
from .portable_layers import mlp
from .portable_target import build_target


@dataclass(frozen=True)
class TargetJob:
    """One export's target: config, checkpoint, captured layers, weight store, per-graph formats."""

    tc: object  # models.config.TargetConfig (or the family's own subclass)
    ckpt: object  # models.checkpoint.Checkpoint
    capture: tuple[int, ...]  # target layers whose hidden states feed the drafter
    store: object  # export.weight_store.WeightStore
    fmt: dict  # graph name -> dict(fmt=..., log=...) (weight_format.py)
    opts: object  # exporter.ExportOptions
    reach: int  # positions the graphs must reach (ExportOptions.positions)


class MlpWriters(NamedTuple):
    """One layer's MLP writers `(g, h, layer) -> out`, per target flavour."""

    portable: Callable
    fused: Callable


def dense_mlps(cfg) -> tuple[MlpWriters, ...]:
    """Every layer's MLP is the dense SwiGLU (portable_layers.mlp) in both flavours."""
    return (MlpWriters(mlp, mlp),) * cfg.num_hidden_layers


def dense_writers(job: TargetJob) -> dict:
    """A dense target's graphs: the portable one and the fused (GroupQueryAttention) one."""
    args = job.tc, job.ckpt, job.capture, job.store
    return {
        "target": lambda p: build_target(*args, p, **job.fmt["target"], reach=job.reach),
        "target_fused": lambda p: build_fused_target(
            *args, p, **job.fmt["target_fused"], reach=job.reach
        ),
    }

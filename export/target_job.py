"""What a family's target graph writers receive (export/families/<model_type>.py), one signature.

The family hands the shared writers what differs up front (its MLP writers: `dense_writers(job,
mlps)` in dense_writers.py); the writers never look the family up again.

>>> writers = family_writers(tc.model_type).target_writers(job)    # doctest: +SKIP
>>> writers["target"](Path("b/target.onnx"))                       # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple


@dataclass(frozen=True)
class TargetJob:
    """One export's target: config, checkpoint, captured layers, weight store, per-graph formats."""

    tc: object  # models.config.TargetConfig (or the family's own subclass)
    ckpt: object  # models.checkpoint.Checkpoint
    capture: tuple[int, ...]  # target layers whose hidden states feed the drafter
    store: object  # export.weight_store.WeightStore
    # graph name -> dict(fmt=..., log=...) (weight_format.py); a graph not named: fp32
    fmt: dict = field(default_factory=dict)
    opts: object = None  # exporter.ExportOptions (None: a graph written alone, as tests do)
    reach: int | None = None  # positions the graphs reach (ExportOptions.positions; None: all)

    def builder(self, graph: str):
        """A GraphBuilder for `graph` over this job's store, in the graph's weight format."""
        from .graph_builder import GraphBuilder

        return GraphBuilder(graph, self.store, **self.fmt.get(graph, {}))


class MlpWriters(NamedTuple):
    """One layer's MLP writers `(g, h, layer) -> out`, per target flavour."""

    portable: Callable
    fused: Callable

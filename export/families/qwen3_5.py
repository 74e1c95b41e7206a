"""qwen3_5: a hybrid target, one graph with linear-attention state (export/hybrid_target.py)."""

from ..dense_writers import dense_mlps as mlp_writers  # noqa: F401  (hybrid_target writes them)
from ..hybrid_target import build_hybrid_target
from ..target_job import TargetJob


def target_writers(job: TargetJob) -> dict:
    """The hybrid graph: full-attention KV plus the linear layers' conv and recurrent state."""
    return {"target_hybrid": lambda p: build_hybrid_target(job, p)}

"""qwen3_5: a hybrid target, one graph with linear-attention state (export/hybrid_target.py)."""
from ..hybrid_target import build_hybrid_target
from ..target_job import TargetJob


def target_writers(job: TargetJob) -> dict:
    """The hybrid graph: full-attention KV plus the linear layers' conv and recurrent state."""
    return {"target_hybrid": lambda p: build_hybrid_target(job.tc, job.ckpt, job.capture, job.store, p,
                                                           job.opts, **job.fmt["target_hybrid"])}

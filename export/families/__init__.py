"""Each family's graph writers, one module per `model_type` (models/families/ holds the rest).

Every module defines `target_writers(job: TargetJob) -> {graph name: writer(path)}`, in writing
order, and `mlp_writers(cfg)`: per decoder layer, its MLP's writers (export/target_job.py).
"""

from __future__ import annotations

import importlib

from ...models.families import family

INTERFACE = ("target_writers", "mlp_writers")


def family_writers(model_type: str):
    """The export module of `model_type` (an unknown one is refused by name, as models' family)."""
    family(model_type)
    return importlib.import_module(f"{__name__}.{model_type}")

"""Drafter kinds, one module per kind (dflash, dflash2), found by the drafter config's class as
families are by `model_type` (export/families/). Adding a kind is adding its module: nothing lists
them.

Every kind module defines (`INTERFACE`):
  Config                   the models/ config class it exports (read_draft_config's result)
  build                    its graph writer: portable_drafter.build_drafter's signature
  check_options(opts)      refuse what this kind cannot export (ExportOptions), by flag
  manifest_fields(dc)      its own keys of the manifest's `model` section
  io_dims(dc)              its own symbols of the drafter graph's I/O (runtime/io_tables.py)
  QUANTIZATION_NOTE        a line for the drafter graph's `quantization` entry, or None
  weight_format(fmt, tc)   the drafter graph's WeightFormat from the exporter's `fmt`
  reference_graph(dc)      parity's torch graph module class (imports torch)
  parity_view(names, got, want)  (got, want) as parity compares them

>>> drafter_kind(src.draft_cfg).__name__      # doctest: +SKIP
'dflash_edge.export.drafters.dflash2'
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ...runtime.errors import ModelFormatError

INTERFACE = (
    "Config",
    "build",
    "check_options",
    "manifest_fields",
    "io_dims",
    "QUANTIZATION_NOTE",
    "weight_format",
    "reference_graph",
    "parity_view",
)


def available() -> tuple[str, ...]:
    """The drafter kinds: the modules present in this folder."""
    here = Path(__file__).resolve().parent
    return tuple(sorted(p.stem for p in here.glob("*.py") if p.stem != "__init__"))


def drafter_kind(dc):
    """The kind module of drafter config `dc` (the one whose `Config` is its class)."""
    for name in available():
        module = importlib.import_module(f"{__name__}.{name}")
        if type(dc) is module.Config:
            return module
    raise ModelFormatError(
        f"drafter config {type(dc).__name__} is no drafter kind the exporter writes "
        f"({', '.join(available())})"
    )


def write_drafter(job, src, path: Path) -> Path:
    """The drafter graph of `src` (sources.Sources) at `path`, by its kind's writer, over the
    export's `job` (target_job.TargetJob: store, formats, options)."""
    return drafter_kind(src.draft_cfg).build(job, src.draft_cfg, src.draft_ckpt, path, src.vocab)

"""Model families, one module per Hugging Face `model_type`, the file name being the key (mlx-lm).

Every family module here is torch-free and offers the same names (`INTERFACE`); its graph writers
are export/families/<model_type>.py. Adding a family is adding its files: nothing lists them.

>>> family("qwen3").attention_spec(cfg).qk_norm      # doctest: +SKIP
True
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ...runtime.errors import ModelFormatError

# What every family module defines (tests/test_families.py checks each one):
#   Config                 its config dataclass (TargetConfig or a subclass): Config.from_dict(raw)
#   GGUF                   its spec.ArchSpec (llama.cpp `general.architecture`), or None
#   attention_spec(cfg)    the full-attention layers' AttentionSpec
#   mlp_specs(cfg)         per decoder layer: a sparse MLP's MoESpec, or None where the MLP is dense
#   tensors(cfg)           the checkpoint's tensors (published names) -> shape
#   check_tensors(cfg, names)  family checks that name a problem before the per-tensor check
#   text_prefix(cfg)       where the text model's weights live ("model"; image-text layouts nest it)
#   dense_view(cfg)        the dense TargetConfig dims a drafter is sized from
#   manifest_fields(cfg)   the family's own keys of the bundle manifest's `model` section
#   planner_dims(cfg)      devices.dims.ModelDims for the planner
#   reference(cfg)         the torch reference model (imports torch)
INTERFACE = (
    "Config",
    "GGUF",
    "attention_spec",
    "mlp_specs",
    "tensors",
    "check_tensors",
    "text_prefix",
    "dense_view",
    "manifest_fields",
    "planner_dims",
    "reference",
)


def available() -> tuple[str, ...]:
    """The supported `model_type`s: the family modules present in this folder."""
    here = Path(__file__).resolve().parent
    return tuple(sorted(p.stem for p in here.glob("*.py") if p.stem != "__init__"))


def family(model_type: str | None):
    """The family module of `model_type`; an unknown one is refused by name, listing the others."""
    if model_type not in available():
        raise ModelFormatError(
            f"model_type {model_type!r} is not supported; supported: {', '.join(available())}"
        )
    return importlib.import_module(f"{__name__}.{model_type}")


def gguf_archs() -> dict:
    """llama.cpp `general.architecture` -> ArchSpec, over the families that declare one."""
    specs = (family(name).GGUF for name in available())
    return {spec.arch: spec for spec in specs if spec is not None}

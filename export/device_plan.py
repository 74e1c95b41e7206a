"""`ExportOptions.device` (`export --device NAME`): the plan's precision and max context, or refuse.

The exporter writes the precisions in `EXPORT_PRECISIONS` (fp32, or quantised through `export
--precision`). The plan picks the first of them that fits, at the requested context or the largest
that fits below it; when none fits it raises, naming what would (precision, context).

>>> choose_for_device(args)       # doctest: +SKIP
('fp32', 2048)
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from ..data import shipped_drafter
from ..devices.detect import detect_cpu
from ..devices.dims import draft_dims_from_config, recipe_drafter
from ..devices.errors import DeviceError
from ..devices.planner import PlanRequest, alternatives, max_context, memory_plan
from ..devices.profiles import get_profile
from ..models import planner_dims

EXPORT_PRECISIONS = ("fp32", "fp16", "int8", "int4")  # most precise first


def _drafter_dims(draft: str, target_cfg: dict, target, block: int):
    if draft in (None, "default"):
        path = shipped_drafter(
            *(target_cfg.get(k) for k in ("hidden_size", "vocab_size", "num_hidden_layers"))
        )
        draft = str(path) if path else "random"
    if draft == "random":
        return recipe_drafter(target, num_layers=1, block_size=block)
    return draft_dims_from_config(
        json.loads((Path(draft) / "config.json").read_text()), f"{draft}/config.json"
    )


def choose_for_device(
    device: str,
    target_dir: Path,
    draft: str,
    block: int,
    context: int,
    precisions: tuple = EXPORT_PRECISIONS,
) -> tuple[str, int]:
    """(precision, max_context) for `device`; DeviceError naming what would fit when nothing
    does."""
    profile = get_profile(device) if device != "cpu" else _cpu_profile()
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    target = planner_dims(cfg)
    drafter = _drafter_dims(draft, cfg, target, block)
    req = PlanRequest(target, drafter, profile, context=context, block=block)
    usable = [replace(req, precision=p) for p in precisions if p in profile.precisions]
    for alt in usable:  # the most precise that fits the requested context ...
        if memory_plan(alt)["fits"]:
            return alt.precision, context
    for alt in usable:  # ... else the most precise that fits a shorter one
        if fitted := max_context(alt):
            fitted = min(fitted, context)
            print(
                f"export --device {device}: {alt.precision} fits up to context {fitted}; using "
                "--max-context "
                f"{fitted} instead of {context}",
                file=sys.stderr,
            )
            return alt.precision, fitted
    would = (
        ", ".join(f"{a['precision']} at context {a['context']}" for a in alternatives(req))
        or "nothing"
    )
    raise DeviceError(
        f"export --device {device}: this exporter writes {', '.join(precisions)} and none of it "
        "fits "
        f"{profile.name} at context >= 256 (would fit: {would}); quantise the bundle or pick a "
        f"bigger device (`dflash-edge devices plan --target {target_dir} --device {device}`)"
    )


def low_bit_ops_for(device: str | None) -> str:
    """How an int4 / int8 bundle's weights are written for `device` (`export --low-bit-ops auto`):
    a CPU gets MatMulNBits (contrib: the source's exact blocks; the standard form fuses into the
    same kernels but holds ~0.45 GB more in an onnxruntime 1.32 session of the 1.5B coder), a GPU or
    Jetson TensorRT's weight-only blocks (tensorrt; devices/planner.runs_on); no device: contrib
    (a TensorRT flavour beside it, contrib+tensorrt, is asked for by name: tensorrt_flavour.py)."""
    if device in (None, "cpu"):
        return "contrib"
    return "contrib" if get_profile(device).device_class == "cpu" else "tensorrt"


def _cpu_profile():

    return detect_cpu().profile

"""`ExportOptions.device` (`export --device NAME`): the plan's precision and max context, or refuse;
and the planner's request for a checkpoint (`plan_request`), which `devices plan --target` and
`export --device` both make.

The exporter writes the precisions in `EXPORT_PRECISIONS` (fp32, or quantised through `export
--precision`). On a CPU the plan picks the first of them that fits; on a GPU / Jetson the one the
planner says runs fastest (DFlash tok/s at its assumed tau) among those that fit, printing each
candidate's tok/s and memory. When none fits the requested context, the most precise that fits a
shorter one; when none fits at all it raises, naming what would (precision, context). The drafter
planned is the one export writes beside the target (`drafter_dims`).

>>> choose_for_device("rtx-4090-24gb", target, "default", 16, 2048)  # doctest: +SKIP
('int4', 2048)
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from ..data import shipped_drafter
from ..devices.detect import detect_cpu
from ..devices.dims import DraftDims, draft_dims_from_config
from ..devices.errors import DeviceError
from ..devices.planner import (
    PlanRequest,
    alternatives,
    draft_precision_of,
    max_context,
    memory_plan,
    speed_plan,
)
from ..devices.profiles import get_profile
from ..models import planner_dims
from ..models.config import TargetConfig
from ..models.draft_config import DraftConfig
from ..models.families import family
from ..models.fetch import target_files
from ..models.gguf_checkpoint import config_dir, is_gguf
from ..models.locate import config_folder, drafter_folder

EXPORT_PRECISIONS = ("fp32", "fp16", "int8", "int4")  # most precise first
# measured on the CPU (benchmarks/drafter_precision_tau.py, docs/BENCHMARKS.md "Drafter precision")
DRAFTER_NOTE = (
    "drafter at 16 bits or less: the shipped drafter keeps its acceptance at int8 and int4 "
    "weights (tau 1.539 and 1.539 against fp32's 1.534); at fp16 it overflows (1.389), so an "
    "fp16 drafter that parity sees overflow is written with int8 weights"
)


def plan_request(tc, draft: str | None, device, **settings) -> PlanRequest:
    """The planner's request for target config `tc` (TargetConfig, or its config.json dict) beside
    the drafter `draft` names (`drafter_dims`) on `device` (a DeviceProfile); `settings`:
    PlanRequest's own fields (precision, context, block, tau)."""
    if isinstance(tc, dict):
        tc = TargetConfig.from_dict(tc)
    return PlanRequest(planner_dims(tc), drafter_dims(draft, tc), device, **settings)


def drafter_dims(draft: str | None, tc) -> DraftDims:
    """The dims of the drafter `export --draft DRAFT` writes beside target config `tc`: a folder's
    or hub id's config.json; "default" / None: the shipped drafter trained for the target, else
    (none shipped, or "random") the random one export makes (sources.drafter_dir: 1 layer at the
    target's dense widths, its trained block 16)."""
    dense = family(tc.model_type).dense_view(tc)  # a drafter's dims are dense
    if draft in (None, "default"):
        path = shipped_drafter(dense.hidden_size, dense.vocab_size, dense.num_hidden_layers)
        draft = str(path) if path else "random"
    if draft == "random":
        return draft_dims_from_config(DraftConfig.for_target(dense, mask_token_id=0).to_dict())
    folder = model_dir(draft, "draft")
    return draft_dims_from_config(read_json(folder / "config.json"), f"{folder}/config.json")


def model_dir(spec: str, what: str) -> Path:
    """The folder holding the config.json of `spec` ("target" or "draft"): a hub id fetches that
    file alone; a GGUF target its small files, never an import of its weights."""
    folder = config_folder(spec, what)
    if folder is not None:
        return folder
    if what != "target":
        return drafter_folder(spec)
    path = target_files(spec)
    return config_dir(path) if is_gguf(path) else path


def read_json(path: Path) -> dict:
    """A config.json as a dict; DeviceError naming the file when it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DeviceError(
            f"{path} cannot be read ({err}); point at a model directory with a config.json"
        ) from err


def choose_for_device(
    device: str,
    target,
    draft: str,
    block: int,
    context: int,
    precisions: tuple = EXPORT_PRECISIONS,
) -> tuple[str, int]:
    """(precision, max_context) for `device` and `target` (sources.Target: its config and folder);
    DeviceError naming what would fit when nothing does. A CPU takes the most precise that fits; a
    GPU / Jetson the fastest (`rank`), its candidates printed on stderr."""
    profile = get_profile(device) if device != "cpu" else detect_cpu().profile
    req = plan_request(target.config, draft, profile, context=context, block=block)
    usable = [replace(req, precision=p) for p in precisions if p in profile.precisions]
    fitting = [alt for alt in usable if memory_plan(alt)["fits"]]
    if fitting and profile.device_class != "cpu":
        ranked = rank(fitting)
        print(describe(device, ranked, usable, context), file=sys.stderr)
        return ranked[0]["precision"], context
    if fitting:  # a CPU: the most precise that fits the requested context ...
        return fitting[0].precision, context
    for alt in usable:  # ... else the most precise that fits a shorter one
        if fitted := max_context(alt):
            fitted = min(fitted, context)
            print(
                f"export --device {device}: {alt.precision} fits up to context {fitted}; using "
                f"--max-context {fitted} instead of {context}",
                file=sys.stderr,
            )
            return alt.precision, fitted
    would = (
        ", ".join(f"{a['precision']} at context {a['context']}" for a in alternatives(req))
        or "nothing"
    )
    raise DeviceError(
        f"export --device {device}: this exporter writes {', '.join(precisions)} and none of it "
        f"fits {profile.name} at context >= 256 (would fit: {would}); quantise the bundle or pick "
        f"a bigger device (`dflash-edge devices plan --target {target.dir} --device {device}`)"
    )


def rank(fitting: list) -> list[dict]:
    """The PlanRequests `fitting` as candidates, fastest first: each one's planned DFlash tok/s at
    the request's tau (plain decode times the expected speedup), plain tok/s, memory, what bounds
    its decode step; ties keep the more precise first."""
    out = []
    for alt in fitting:
        speed, mem = speed_plan(alt), memory_plan(alt)
        out.append(
            {
                "precision": alt.precision,
                "draft_precision": draft_precision_of(alt),
                "tok_s": round(speed["plain_tokens_per_s"] * speed["expected_speedup"], 1),
                "plain_tok_s": speed["plain_tokens_per_s"],
                "memory_gb": mem["total_gb"],
                "usable_gb": mem["usable_gb"],
                "bound": speed["decode"]["bound"],
            }
        )
    return sorted(out, key=lambda c: -c["tok_s"])  # sorted() is stable: ties stay in order


def describe(device: str, ranked: list[dict], usable: list, context: int) -> str:
    """The plan as printed: one line per candidate (planned tok/s, memory) and why the first won;
    precisions that do not fit the context are named."""
    best = ranked[0]
    lines = [f"export --device {device}: candidates at context {context} (planned, fastest first)"]
    for c in ranked:
        lines.append(
            f"  {c['precision']:>5} (drafter {c['draft_precision']}): {c['tok_s']:.1f} tok/s "
            f"DFlash, {c['plain_tok_s']:.1f} plain; {c['memory_gb']:.2f} of {c['usable_gb']:.2f} GB"
            + ("  <- chosen" if c is best else "")
        )
    ruled_out = [a.precision for a in usable if a.precision not in {c["precision"] for c in ranked}]
    if ruled_out:
        lines.append(f"  does not fit at context {context}: {', '.join(ruled_out)}")
    why = f"{best['precision']}: the fastest that fits (its decode is {best['bound']}-bound"
    if len(ranked) > 1:
        why += f", {best['tok_s'] / ranked[1]['tok_s']:.2f}x {ranked[1]['precision']}'s tok/s"
    lines.append(f"  chose {why}; --precision picks another)")
    lines.append(f"  {DRAFTER_NOTE}")
    return "\n".join(lines)


def device_class_of(device: str | None) -> str:
    """The device class of `device` ("cpu" without one)."""
    return "cpu" if device in (None, "cpu") else get_profile(device).device_class


def low_bit_ops_for(device: str | None) -> str:
    """How an int4 / int8 bundle's weights are written for `device` (`export --low-bit-ops auto`):
    a CPU gets MatMulNBits (contrib: the source's exact blocks; the standard form fuses into the
    same kernels but holds ~0.45 GB more in an onnxruntime 1.32 session of the 1.5B coder), a GPU or
    Jetson TensorRT's weight-only blocks (tensorrt; devices/planner.runs_on); no device: contrib."""
    return "contrib" if device_class_of(device) == "cpu" else "tensorrt"

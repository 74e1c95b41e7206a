"""The TensorRT flavour of a low-bit bundle: a second bundle in `tensorrt/`, written beside the CPU
graphs (`export --low-bit-ops contrib+tensorrt`), for one folder that serves a CPU and a Jetson.

Why a second copy: a CPU runs a GGUF's exact blocks through onnxruntime's MatMulNBits (32 wide;
Q4_1 / Q4_K with offsets), and TensorRT takes none of that: INT4 only symmetric in blocks of 64 /
128, INT8 per channel (engines/op_support.WEIGHT_ONLY). Re-quantised to those rules
(dq_format.tensorrt_operands) the weights run on onnxruntime's CPU too, but 2.5x slower, and not
losslessly: onnxruntime 1.32's int4 kernels give a row the same bits whatever the step's length
only for blocks of 16 / 32 (docs/BENCHMARKS.md). So neither copy can serve both. The flavour is a
whole bundle (manifest, portable target and drafter in standard ONNX, opset 21, parity-checked) that
`build-engines` reads as any; the main manifest names it under `flavours`. Files equal to the CPU
bundle's are copied, not hard-linked: onnx refuses hard-linked external data ("potential hardlink
attack").

>>> why_not({"model": {"hidden_size": 96, "intermediate_size": 256, "num_heads": 2,
...     "head_dim": 48}, "graphs": {"target": {"precision": "int4"}}})
'hidden_size 96 is not a multiple of 64 (TensorRT tiles INT4 weights in blocks of 64 / 128)'
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

FLAVOUR = "tensorrt"  # the sub-folder, and the flavour's name in the main manifest
TILE = 64  # the smallest INT4 block TensorRT takes: every low-bit weight's K must tile it


def why_not(manifest: dict) -> str | None:
    """Why this bundle gets no TensorRT flavour (None: it gets one)."""
    model, graphs = manifest["model"], manifest["graphs"]
    if graphs.get("target", {}).get("precision") not in ("int4", "int8"):
        return "the target is not int4 / int8 (its portable graphs are TensorRT's already)"
    if model.get("num_experts"):
        return "a mixture-of-experts target (its experts are onnxruntime's QMoE kernel)"
    if "target_hybrid" in graphs:
        return "a hybrid (linear-attention) target"
    if model.get("draft_selector_top_k"):
        return "a DFlash2 drafter (its lattice graph is not written in TensorRT's blocks yet)"
    widths = {
        "hidden_size": model["hidden_size"],
        "intermediate_size": model.get("intermediate_size", TILE),
        "draft_intermediate_size": model.get("draft_intermediate_size", TILE),
        "num_heads * head_dim": model["num_heads"] * model["head_dim"],
    }
    for name, k in widths.items():
        if k % TILE:
            return (
                f"{name} {k} is not a multiple of {TILE} (TensorRT tiles INT4 weights in blocks "
                f"of 64 / 128)"
            )
    return None


def write_flavour(opts, tmp: Path, write, manifest: dict) -> dict | None:
    """Write the flavour into `tmp`/tensorrt with `write` (exporter._write) and return the main
    manifest's `flavours` entry; None (and a note on stderr) where `why_not` says no."""
    import sys

    reason = why_not(manifest)
    if reason is not None:
        print(f"export: no TensorRT flavour: {reason}", file=sys.stderr)
        return None
    sub = tmp / FLAVOUR
    sub.mkdir()
    flavour_opts = dataclasses.replace(opts, low_bit_ops="tensorrt", fused=False, kv_cache="fp32")
    graphs = write(flavour_opts, sub)
    return {
        "path": FLAVOUR,
        "low_bit_ops": "tensorrt",
        "graphs": sorted(graphs),
        "bytes": sum(f.stat().st_size for f in sub.iterdir()),
    }

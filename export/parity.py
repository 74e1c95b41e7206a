"""Parity at export: each ONNX graph in onnxruntime (CPU) against the torch reference on real inputs.

The graphs run first, one session at a time (no pre-packed weight copies, external data memory-mapped),
their outputs are kept (small: a prompt's logits), the sessions are dropped, and only then does the torch
reference run on the very same inputs (`reference`, a callable: export/sources.reference, the layer-streamed
torch models of models/graphs.py), so the two never hold the weights at the same time.

>>> report = check_graphs(paths, Probe(prompt_ids, block=16, mask_id=5, dims=dims), reference)  # doctest: +SKIP
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from dflash_edge.runtime.errors import DflashEdgeError


class ParityError(DflashEdgeError):
    """An exported graph disagrees with the torch reference beyond tolerance."""


@dataclass(frozen=True)
class Tolerance:
    logits: float = 1e-3        # max abs diff
    hidden: float = 1e-4        # relative to the reference's max |value| (hidden states carry outliers ~1e3)
    kv: float = 1e-4            # relative, likewise
    argmax_agreement: float = 1.0


@dataclass(frozen=True)
class Probe:
    """The parity inputs: a real (chat-encoded) prompt, the block size, the mask id and the KV dims
    (`dims`: L, Ld, Hkv, D)."""
    prompt_ids: list[int]
    block: int
    mask_id: int
    dims: dict


_TARGET_IN = ("input_ids", "start", "past_key", "past_value")
_DRAFTER_IN = ("block_ids", "ctx_hidden", "start", "past_key", "past_value")
_OUTPUTS = {"target": ("logits", "next_ids", "hidden", "new_key", "new_value"),
            "drafter": ("draft_ids", "new_key", "new_value")}


def _session(path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.disable_prepacking", "1")     # no second (packed) copy of each weight
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _run(session, feeds: tuple, names: tuple[str, ...]) -> tuple:
    return tuple(session.run(None, dict(zip(names, feeds))))


def run_graphs(paths: dict, probe: Probe) -> tuple[dict, dict]:
    """(inputs, onnxruntime outputs), graph -> one tuple per case: a prefill and a verify-shaped call of the
    target (on the prefill's K/V), one draft (on the prefill's features); the fused target steps through both."""
    prompt, d = probe.prompt_ids, probe.dims
    empty = np.zeros((0, d["L"], d["Hkv"], d["D"]), np.float32)                    # [S=0, L, Hkv, D]
    session = _session(paths["target"])
    prefill_in = (np.array([prompt], np.int64), np.array([0], np.int64), empty, empty)
    prefill = _run(session, prefill_in, _TARGET_IN)
    last = int(prefill[1][0, -1])
    verify_in = (np.array([[last] + prompt[:probe.block - 1]], np.int64), np.array([len(prompt)], np.int64),
                 prefill[3], prefill[4])
    inputs = {"target": [prefill_in, verify_in]}
    got = {"target": [prefill, _run(session, verify_in, _TARGET_IN)]}
    del session
    d_empty = np.zeros((0, d["Ld"], d["Hkv"], d["D"]), np.float32)                 # [S=0, Ld, Hkv, D]
    block = np.array([[last] + [probe.mask_id] * (probe.block - 1)], np.int64)     # [1, B]
    inputs["drafter"] = [(block, prefill[2], np.array([0], np.int64), d_empty, d_empty)]
    session = _session(paths["drafter"])
    got["drafter"] = [_run(session, inputs["drafter"][0], _DRAFTER_IN)]
    del session
    if "target_fused" in paths:                    # the same target cases, step after step over its own buffers
        steps = [(f[0], int(f[1][0])) for f in inputs["target"]]
        got["target_fused"] = run_fused(_session(paths["target_fused"]), steps)
    return inputs, got


def run_fused(session, steps) -> list[tuple]:
    """The fused target over head-major buffers [1, Hkv, Smax, D], step after step: per step (logits,
    next_ids, hidden, new_key [T, L, Hkv, D], new_value) read back from the rows it wrote."""
    shapes = {i.name: i.shape for i in session.get_inputs()}
    layers = sum(name.startswith("past_key.") for name in shapes)
    kv_heads, head_dim = shapes["past_key.0"][1], shapes["past_key.0"][3]
    capacity = max(start + ids.shape[1] for ids, start in steps) + 1            # + the slot of its pad row
    cache = {f"past_{kv}.{i}": np.zeros((1, kv_heads, capacity, head_dim), np.float32)
             for kv in ("key", "value") for i in range(layers)}
    names = [o.name for o in session.get_outputs()]
    outs = []
    for ids, start in steps:
        num_new = ids.shape[1]
        feeds = {"input_ids": ids, "seqlens_k": np.array([start + num_new - 1], np.int32),
                 "total_sequence_length": np.array(start + num_new, np.int32), **cache}
        out = dict(zip(names, session.run(None, feeds)))
        rows = [np.stack([out[f"present_{kv}.{i}"][0, :, start:start + num_new].transpose(1, 0, 2)
                          for i in range(layers)], axis=1) for kv in ("key", "value")]    # [T, L, Hkv, D]
        outs.append((out["logits"], out["next_ids"], out["hidden"], *rows))
        cache.update({f"past_{kv}.{i}": out[f"present_{kv}.{i}"] for kv in ("key", "value") for i in range(layers)})
    return outs


def _compare(graph: str, names, got, want, tol: Tolerance, report: dict) -> None:
    """Check onnxruntime outputs `got` against the reference `want` (numpy arrays, one per name)."""
    for name, g, w in zip(names, got, want):
        w = np.asarray(w)
        if g.dtype == np.int64:
            agree = float((g == w).mean())
            report[f"{graph}.{name}.agreement"] = min(agree, report.get(f"{graph}.{name}.agreement", 1.0))
            if agree < tol.argmax_agreement:
                raise ParityError(f"graph {graph!r} output {name!r}: argmax agrees on {agree:.1%} of positions "
                                  f"(need {tol.argmax_agreement:.0%})")
            continue
        diff = float(np.abs(g.astype(np.float32) - w).max())
        report[f"{graph}.{name}.max_abs_diff"] = max(diff, report.get(f"{graph}.{name}.max_abs_diff", 0.0))
        if name == "logits":
            limit = tol.logits
        else:   # relative: scaled by the largest reference magnitude
            scale = float(np.abs(w).max()) or 1.0
            limit = (tol.hidden if name == "hidden" else tol.kv) * scale
            report[f"{graph}.{name}.max_abs"] = max(scale, report.get(f"{graph}.{name}.max_abs", 0.0))
        if not diff <= limit:
            raise ParityError(f"graph {graph!r} output {name!r}: max abs diff {diff:.3g} > {limit:.3g} vs torch")


def check_graphs(paths: dict, probe: Probe, reference, tol: Tolerance = Tolerance(), stage=None) -> dict:
    """Run every graph of `paths` on `probe`'s inputs, then `reference(inputs)` (graph -> torch outputs per
    case, numpy) on the same inputs, and compare. `stage(name)`: a context manager timing the reference
    (the exporter's memory meter). Returns {graph.output.metric: value}; raises ParityError on the first failure.
    """
    stage = stage or (lambda _: nullcontext())
    with stage("parity_onnxruntime"):
        inputs, got = run_graphs(paths, probe)
    with stage("reference"):
        want = reference(inputs)
    report: dict = {}
    for graph in ("target", "drafter"):
        for g, w in zip(got[graph], want[graph]):
            _compare(graph, _OUTPUTS[graph], g, w, tol, report)
    for g, w in zip(got.get("target_fused", []), want["target"]):
        _compare("target_fused", _OUTPUTS["target"], g, w, tol, report)
    return report

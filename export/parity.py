"""Parity at export: each ONNX graph in onnxruntime (CPU) against the torch reference on real inputs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dflash_edge.runtime.errors import DflashEdgeError


class ParityError(DflashEdgeError):
    """An exported graph disagrees with the torch reference beyond tolerance."""


@dataclass(frozen=True)
class Tolerance:
    logits: float = 1e-3        # max abs diff
    hidden: float = 1e-4        # relative to the reference's max |value| (hidden states carry outliers ~1e3)
    kv: float = 1e-4            # relative, likewise
    argmax_agreement: float = 1.0


def _session(path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _compare(graph: str, names, got, want, tol: Tolerance, report: dict) -> None:
    """Check onnxruntime outputs `got` against the reference `want` (torch tensors or numpy arrays)."""
    for name, g, w in zip(names, got, want):
        w = w.detach().numpy() if hasattr(w, "detach") else np.asarray(w)
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


_TARGET_IN = ("input_ids", "start", "past_key", "past_value")
_DRAFTER_IN = ("block_ids", "ctx_hidden", "start", "past_key", "past_value")


def check_graphs(paths: dict, cases: dict, tol: Tolerance = Tolerance()) -> dict:
    """Run each graph in onnxruntime on the inputs of `cases` (from `reference_cases`) and compare.

    The torch outputs were computed before export, so the torch models are gone by now: the two never
    coexist in memory. Returns a report {graph.output.metric: value}; raises ParityError on the first failure.
    """
    report: dict = {}
    for graph, names in (("target", _TARGET_IN), ("drafter", _DRAFTER_IN)):
        session = _session(paths[graph])
        out_names = [o.name for o in session.get_outputs()]
        for feeds, want in cases[graph]:
            got = session.run(None, {n: t.numpy() for n, t in zip(names, feeds)})
            _compare(graph, out_names, got, want, tol, report)
        del session
    if "target_fused" in paths:                    # the same target cases, step after step over its own buffers
        steps = [(feeds[0], int(feeds[1][0]), want) for feeds, want in cases["target"]]
        capacity = max(start + ids.shape[1] for ids, start, _ in steps) + 1      # + the slot of its pad row
        check_fused(_session(paths["target_fused"]), steps, capacity, tol, report)
    return report


def reference_cases(modules: dict, prompt_ids: list[int], block: int) -> dict:
    """graph -> [(inputs, torch outputs)] on real inputs: a prefill and a verify-shaped call of the target
    (with the prompt's torch K/V as past) and one draft; `modules` holds the graph modules and empty caches."""
    prompt = torch.tensor([prompt_ids])
    empty = modules["kv_empty_target"]
    with torch.no_grad():
        feeds = (prompt, torch.tensor([0]), empty, empty)
        want = modules["target"](*feeds)
        # verify-shaped call on top of the prefix cache, with the (torch) K/V of the prompt as past
        block_ids = torch.tensor([[int(want[1][0, -1])] + prompt_ids[:block - 1]])
        feeds_v = (block_ids, torch.tensor([len(prompt_ids)]), want[3], want[4])
        want_v = modules["target"](*feeds_v)
        d_empty = modules["kv_empty_drafter"]
        mask_id = modules["drafter"].drafter.config.mask_token_id
        d_block = torch.tensor([[int(want[1][0, -1])] + [mask_id] * (block - 1)])
        feeds_d = (d_block, want[2], torch.tensor([0]), d_empty, d_empty)
        want_d = modules["drafter"](*feeds_d)
    return {"target": [(feeds, want), (feeds_v, want_v)], "drafter": [(feeds_d, want_d)]}
def check_fused(session, steps, capacity: int, tol: Tolerance, report: dict) -> None:
    """The fused target over head-major buffers, step after step, against the portable graph's torch
    outputs `want` = (logits, next_ids, hidden, new_key [T, L, Hkv, D], new_value) for each (ids, start, want)."""
    layers, kv_heads, head_dim = steps[0][2][3].shape[1:]
    cache = {f"past_{kv}.{i}": np.zeros((1, kv_heads, capacity, head_dim), np.float32)     # [1, Hkv, Smax, D]
             for kv in ("key", "value") for i in range(layers)}
    names = [o.name for o in session.get_outputs()]
    for ids, start, want in steps:
        num_new = ids.shape[1]
        feeds = {"input_ids": ids.numpy(), "seqlens_k": np.array([start + num_new - 1], np.int32),
                 "total_sequence_length": np.array(start + num_new, np.int32), **cache}
        out = dict(zip(names, session.run(None, feeds)))
        _compare("target_fused", ["logits", "next_ids", "hidden"], [out[n] for n in ("logits", "next_ids", "hidden")],
                 want[:3], tol, report)
        for kv, ref in (("key", want[3]), ("value", want[4])):
            rows = np.stack([out[f"present_{kv}.{i}"][0, :, start:start + num_new].transpose(1, 0, 2)
                             for i in range(layers)], axis=1)                               # [T, L, Hkv, D]
            _compare("target_fused", [f"new_{kv}"], [rows], [ref], tol, report)
            cache.update({f"past_{kv}.{i}": out[f"present_{kv}.{i}"] for i in range(layers)})

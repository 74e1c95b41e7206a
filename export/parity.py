"""Parity at export: each ONNX graph in onnxruntime (CPU) against the torch reference on real
inputs.

The graphs run first, one session at a time (no pre-packed weight copies, external data
memory-mapped), their outputs are kept (small: a prompt's logits), the sessions are dropped, and
only then does the torch reference run on the very same inputs (`reference`, a callable:
export/sources.reference, the layer-streamed torch models of models/graphs.py), so the two never
hold the weights at the same time.

>>> probe = Probe(prompt_ids, block=16, mask_id=5, dims=dims)  # doctest: +SKIP
>>> report = check_graphs(paths, probe, reference)  # doctest: +SKIP
"""

from __future__ import annotations

import os
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from ..runtime.errors import DflashEdgeError
from ..runtime.io_tables import GRAPHS, expand_specs
from ..runtime.memory import release_free_memory
from .graph_builder import ACCURACY_KEY, Float16Overflow


class ParityError(DflashEdgeError):
    """An exported graph disagrees with the torch reference beyond tolerance."""


class ParityOverflow(ParityError, Float16Overflow):
    """A graph's activations overflow (an inf / NaN): float16 cannot hold this model's values."""


@dataclass(frozen=True)
class Tolerance:
    logits: float = (
        1e-3  # max abs diff (relative to the reference's max |logit| when logits_relative)
    )
    hidden: float = (
        1e-4  # relative to the reference's max |value| (hidden states carry outliers ~1e3)
    )
    kv: float = 1e-4  # relative, likewise
    argmax_agreement: float = 1.0
    logits_relative: bool = False
    # a DFlash2 drafter's candidate sets, row by row: its arithmetic is fp32 where they are chosen
    # (drafters/dflash2.weight_format, a low-bit tied head re-ranked), so they are the reference's
    # but where fp16 rounds
    candidates: float = 1.0


def tolerance_for(precision: str, accuracy_level: int, recurrent: bool = False) -> Tolerance:
    """Bounds against the reference on the bundle's own (dequantised) weights. fp32 arithmetic keeps
    the fp32 bounds (fp32, and MatMulNBits at level 0); fp16 rounds every activation; MatMulNBits at
    level 4 rounds every matmul input to int8 per block of 32, which moves SmolLM2's logits by up to
    ~2.4 and flips ~6% of its near-tied argmaxes (docs/BENCHMARKS.md, "Exact low-bit imports"):
    there the argmaxes must still mostly agree, the logits, hidden states and K/V stay within 35%,
    5% and 15% of their scale."""
    # a recurrent graph too: fp32 within ~1e-6 of the reference even where its memory is long
    # (tests/test_hybrid_parity.py; a 5% decay error there is 2.5e-3 off, a dropped conv state 0.2)
    if precision == "fp32" or (precision in ("int4", "int8") and accuracy_level == 0):
        return Tolerance()
    if precision == "fp16":
        return Tolerance(logits=0.5, hidden=5e-2, kv=5e-2, argmax_agreement=0.9, candidates=0.9)
    # a hybrid target's linear layers carry the rounding through their recurrent state into the full
    # layers' K/V: 16% of scale on tests/test_qwen3_5.py's tiny model (at level 0: within 1e-4)
    return Tolerance(
        logits=0.35,
        hidden=5e-2,
        kv=0.25 if recurrent else 0.15,
        argmax_agreement=0.85,
        logits_relative=True,
    )


@dataclass(frozen=True)
class Probe:
    """The parity inputs: a real (chat-encoded) prompt, the block size, the mask id and the KV dims
    (`dims`: L, Ld, Hkv, D)."""

    prompt_ids: list[int]
    block: int
    mask_id: int
    dims: dict


def io_names(graph: str, kind: str) -> tuple[str, ...]:
    """The names of `graph`'s inputs or outputs, in runtime/io_tables.py's order."""
    return tuple(spec.name for spec in GRAPHS[graph][kind])


_TARGET_IN = io_names("target", "inputs")
ALL_ROWS = np.array([0], np.int64)  # `logits_from`: the head on every row, as the reference
_DRAFTER_IN = io_names("drafter", "inputs")
# the hybrid target's outputs compared with the reference (its state rows are checked through the
# next call's logits: models/linear_attention.py keeps no per-token rows to compare them with)
_HYBRID_OUT = ("logits", "next_ids", "new_key", "new_value")
_OUTPUTS = {
    "target": io_names("target", "outputs"),
    "drafter": io_names("drafter", "outputs"),
    "target_fused": io_names("target", "outputs"),
    "target_hybrid": _HYBRID_OUT,
}


def _session(path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    low_bit, level = _low_bit(path)
    if not low_bit:  # no second (packed) copy of each float weight; MatMulNBits without its packed
        # copy repacks per call, and holds more
        opts.add_session_config_entry("session.disable_prepacking", "1")
    if level is not None:  # DequantizeLinear weights: what the fused MatMulNBits computes with
        opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", level)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _low_bit(path) -> tuple[bool, str | None]:
    """(low-bit weights?, the accuracy level its DequantizeLinear weights ask for, or None)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    level = {p.key: p.value for p in model.metadata_props}.get(ACCURACY_KEY)
    low = any(n.op_type in ("MatMulNBits", "DequantizeLinear") for n in model.graph.node)
    return low, level


def _run(session, feeds: tuple, names: tuple[str, ...]) -> tuple:
    return _owned(session.run(None, dict(zip(names, feeds))))


def _owned(outputs) -> tuple:
    """Copies of a session's outputs: an output array lives in its session's memory arena, and
    keeping one would keep the whole arena (0.7 GB of a Qwen3-Coder-30B-A3B slice's expert buffers)
    after the session is dropped."""
    return tuple(None if o is None else np.array(o) for o in outputs)


def run_graphs(paths: dict, probe: Probe) -> tuple[dict, dict]:
    """(inputs, onnxruntime outputs), graph -> one tuple per case: a prefill and a verify-shaped
    call of the target (on the prefill's K/V), two drafts (`drafter_cases`); the fused target steps
    through both."""

    if "target_hybrid" in paths:
        inputs, got, features, last = run_hybrid(_session(paths["target_hybrid"]), probe)
    else:
        inputs, got, features, last = _run_target(_session(paths["target"]), probe)
    release_free_memory()  # the dropped session's heap back to the OS before the next one is built
    block = np.array([[last] + [probe.mask_id] * (probe.block - 1)], np.int64)  # [1, B]
    session = _session(paths["drafter"])
    inputs["drafter"], got["drafter"] = drafter_cases(session, block, features)
    del session
    release_free_memory()
    if "target_fused" in paths:  # the same target cases, step after step over its own buffers
        steps = [(f[0], int(f[2][0])) for f in inputs["target"]]
        got["target_fused"] = run_fused(_session(paths["target_fused"]), steps)
        release_free_memory()
    return inputs, got


def _run_target(session, probe: Probe) -> tuple[dict, dict, np.ndarray, int]:
    """The portable target's cases: a prefill from an empty cache, then a verify-shaped call on
    its K/V; (inputs, outputs, the prefill's context features, its last greedy token)."""
    prompt, d = probe.prompt_ids, probe.dims
    empty = np.zeros((0, d["L"], d["Hkv"], d["D"]), np.float32)  # [S=0, L, Hkv, D]
    ids = np.array([prompt], np.int64)
    prefill_in = (ids, ALL_ROWS, np.array([0], np.int64), empty, empty)
    prefill = _run(session, prefill_in, _TARGET_IN)
    last = int(prefill[1][0, -1])
    verify_in = (
        np.array([[last] + prompt[: probe.block - 1]], np.int64),
        ALL_ROWS,
        np.array([len(prompt)], np.int64),
        prefill[3],
        prefill[4],
    )
    got = [prefill, _run(session, verify_in, _TARGET_IN)]
    return {"target": [prefill_in, verify_in]}, {"target": got}, prefill[2], last


def run_hybrid(session, probe: Probe) -> tuple[dict, dict, np.ndarray, int]:
    """The hybrid target's cases, as `_run_target`'s: a prefill from empty states, then a
    verify-shaped call keeping all of it (states rebuilt from the prefill's rows, as the runtime
    feeds them)."""
    names = io_names("target_hybrid", "inputs")
    outputs = [o.name for o in session.get_outputs()]
    shapes = {i.name: i.shape for i in session.get_inputs()}
    # S = Tp = 0; zero states
    feeds = {
        n: np.zeros([0 if isinstance(s, str) else s for s in shapes[n]], np.float32)
        for n in names
        if n not in ("input_ids", "logits_from", "start", "kept")
    }
    prompt, cases, got = probe.prompt_ids, [], []
    calls = [(prompt, 0)]
    for step in range(2):
        ids, start = calls[step]
        case = {
            **feeds,
            "input_ids": np.array([ids], np.int64),
            "logits_from": ALL_ROWS,
            "start": np.array([start], np.int64),
            "kept": np.array([len(calls[step - 1][0]) if step else 0], np.int64),
        }
        out = dict(zip(outputs, _owned(session.run(None, case))))
        cases.append(tuple(case[n] for n in names))
        got.append(tuple(out[n] for n in _HYBRID_OUT))
        feeds = next_hybrid_feeds(case, out)
        if step == 0:
            features, last = out["hidden"], int(out["next_ids"][0, -1])
            calls.append(([last] + prompt[: probe.block - 1], len(prompt)))
    return {"target_hybrid": cases}, {"target_hybrid": got}, features, last


def next_hybrid_feeds(feeds: dict, out: dict) -> dict:
    """The hybrid target's state feeds for its next call: `feeds`' K/V rows plus the ones `out`
    (its outputs by name) added, and the starting states it rebuilt."""
    return {
        "past_key": np.concatenate([feeds["past_key"], out["new_key"]]),
        "past_value": np.concatenate([feeds["past_value"], out["new_value"]]),
        "conv_base": out["conv_start"],
        "rec_base": out["rec_start"],
        "prev_qkv": out["qkv"],
        "prev_k": out["delta_k"],
        "prev_u": out["delta_u"],
        "prev_decay": out["decay"],
    }


def drafter_cases(
    session, block: np.ndarray, features: np.ndarray
) -> tuple[list[tuple], list[tuple]]:
    """(inputs, outputs) of two drafter calls: the whole prompt's `features` [1, n, N] from an empty
    cache, then its last third again on the first call's cached K/V (so cached rows, and a sliding
    layer's window of the W-1 positions before `start`, are checked too). Tuples in the order of
    `_DRAFTER_IN` / `_OUTPUTS["drafter"]`, None where the graph has no such tensor (a drafter
    without sliding layers, or without full ones); cache shapes come from the graph's own inputs."""
    shapes = {i.name: i.shape for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]

    def run(feeds: tuple) -> tuple:
        got = dict(
            zip(
                outputs,
                _owned(
                    session.run(None, {n: f for n, f in zip(_DRAFTER_IN, feeds) if f is not None})
                ),
            )
        )
        return tuple(got.get(n) for n in _OUTPUTS["drafter"])

    caches = _DRAFTER_IN[3:]
    # no past rows; W-1 empty window rows
    empty = {
        n: np.zeros((0, *shapes[n][1:]) if n.startswith("past") else shapes[n], np.float32)
        for n in caches
        if n in shapes
    }
    first = (block, features, np.array([0], np.int64), *(empty.get(n) for n in caches))
    out = run(first)
    new = dict(zip(caches, out[1:]))  # past_key <- new_key, window_key <- new_window_key
    split = features.shape[1] - max(1, features.shape[1] // 3)
    # windows: the W-1 rows before `split`
    kept = {
        n: new[n][:split]
        if n.startswith("past")
        else np.concatenate([empty[n], new[n][:split]])[split:]
        for n in empty
    }
    second = (
        block,
        features[:, split:],
        np.array([split], np.int64),
        *(kept.get(n) for n in caches),
    )
    return [first, second], [out, run(second)]


def run_fused(session, steps) -> list[tuple]:
    """The fused target over head-major buffers [1, Hkv, Smax, D], step after step: per step
    (logits, next_ids, hidden, new_key [T, L, Hkv, D], new_value) read back from the rows it
    wrote."""
    shapes = {i.name: i.shape for i in session.get_inputs()}
    layers = sum(name.startswith("past_key.") for name in shapes)
    kv_heads, head_dim = shapes["past_key.0"][1], shapes["past_key.0"][3]
    capacity = max(start + ids.shape[1] for ids, start in steps) + 1  # + the slot of its pad row
    per_layer = expand_specs(GRAPHS["target_fused"]["inputs"], {"L": layers})
    cache = {
        spec.name: np.zeros((1, kv_heads, capacity, head_dim), np.float32)
        for spec in per_layer
        if spec.name.startswith("past_")
    }
    names = [o.name for o in session.get_outputs()]
    outs = []
    for ids, start in steps:
        num_new = ids.shape[1]
        lengths = (np.array([start + num_new - 1], np.int32), np.array(start + num_new, np.int32))
        feeds = {
            **dict(zip(("seqlens_k", "total_sequence_length"), lengths)),
            "input_ids": ids,
            "logits_from": ALL_ROWS,
            **cache,
        }
        out = dict(zip(names, _owned(session.run(None, feeds))))
        # [T, L, Hkv, D]
        rows = [
            np.stack(
                [
                    out[f"present_{kv}.{i}"][0, :, start : start + num_new].transpose(1, 0, 2)
                    for i in range(layers)
                ],
                axis=1,
            )
            for kv in ("key", "value")
        ]
        outs.append((out["logits"], out["next_ids"], out["hidden"], *rows))
        cache.update(
            {
                f"past_{kv}.{i}": out[f"present_{kv}.{i}"]
                for kv in ("key", "value")
                for i in range(layers)
            }
        )
    return outs


def _compare(graph: str, names, got, want, tol: Tolerance, report: dict) -> None:
    """Check onnxruntime outputs `got` against the reference `want` (numpy arrays, one per name)."""
    for name, g, w in zip(names, got, want):
        if g is None and w is None:  # a tensor this graph does not have
            continue
        w = np.asarray(w)
        if name == "candidate_ids":
            _check_candidates(graph, g, w, tol, report)
            continue
        if g.dtype == np.int64:
            agree = float((g == w).mean())
            report[f"{graph}.{name}.agreement"] = min(
                agree, report.get(f"{graph}.{name}.agreement", 1.0)
            )
            if agree < tol.argmax_agreement:
                raise ParityError(
                    f"graph {graph!r} output {name!r}: argmax agrees on {agree:.1%} of positions "
                    f"(need {tol.argmax_agreement:.0%})"
                )
            continue
        diff = float(np.abs(g.astype(np.float32) - w).max())
        report[f"{graph}.{name}.max_abs_diff"] = max(
            diff, report.get(f"{graph}.{name}.max_abs_diff", 0.0)
        )
        if name == "logits" and not tol.logits_relative:
            limit = tol.logits
        elif name == "logits":
            limit = tol.logits * (float(np.abs(w).max()) or 1.0)
        else:  # relative: scaled by the largest reference magnitude
            scale = float(np.abs(w).max()) or 1.0
            limit = (tol.hidden if name == "hidden" else tol.kv) * scale
            report[f"{graph}.{name}.max_abs"] = max(
                scale, report.get(f"{graph}.{name}.max_abs", 0.0)
            )
        if not diff <= limit:
            raise ParityError(
                f"graph {graph!r} output {name!r}: max abs diff {diff:.3g} > {limit:.3g} vs torch"
            )


def _check_candidates(graph: str, got, want, tol: Tolerance, report: dict) -> None:
    """Each row's candidate set [1, R, k] (sorted: drafters/dflash2.parity_view) against the
    reference's: the share of rows that agree is recorded; below `tol.candidates` the first row
    that differs is named, with the tokens only one side proposes."""
    same = (got == want).all(-1)[0]  # [R]
    agree = float(same.mean())
    key = f"{graph}.candidate_ids.agreement"
    report[key] = min(agree, report.get(key, 1.0))
    if agree < tol.candidates:
        r = int(np.argmin(same))
        only = sorted(set(got[0, r].tolist()) ^ set(want[0, r].tolist()))
        raise ParityError(
            f"graph {graph!r} output 'candidate_ids': {agree:.1%} of rows propose the reference's "
            f"candidates (need {tol.candidates:.0%}); row {r} differs in tokens {only}"
        )


def check_graphs(
    paths: dict, probe: Probe, reference, tol: Tolerance = Tolerance(), stage=None, views=None
) -> dict:
    """Run every graph of `paths` on `probe`'s inputs, then `reference(inputs)` (graph -> torch
    outputs per case, numpy) on the same inputs, and compare. `stage(name)`: a context manager
    timing the reference (the exporter's memory meter); `views`: graph -> `(names, got, want) ->
    (got, want)` as compared (a drafter kind's `parity_view`: export/drafters/). Returns
    {graph.output.metric: value}; raises ParityError on the first failure."""
    stage = stage or (lambda _: nullcontext())
    with stage("parity_onnxruntime"):
        inputs, got = run_graphs(paths, probe)
        check_finite(paths, inputs, got)
    with stage("reference"):
        want = reference(inputs)
    report: dict = {}
    for graph in got:
        cases = zip(got[graph], want["target" if graph == "target_fused" else graph])
        view = (views or {}).get(graph, lambda names, g, w: (g, w))
        for case, (g, w) in enumerate(cases):
            try:
                _compare(graph, _OUTPUTS[graph], *view(_OUTPUTS[graph], g, w), tol, report)
            except ParityError as error:  # finite outputs, but an activation overflowed?
                raise _overflowed(paths, inputs, graph, case) or error
    return report


def _overflowed(paths: dict, inputs: dict, graph: str, case: int) -> ParityError | None:
    """A ParityError naming the first node with an inf/NaN activation of `graph`'s `case` (its
    outputs can still be finite: a NaN turned to 0 further on), or None when none has one."""
    if graph not in inputs:
        return None
    where = first_non_finite(paths[graph], inputs[graph][case])
    if where == "an output only":
        return None
    return ParityOverflow(
        f"graph {graph!r} overflows: inf/NaN first at {where}; float16 activations cannot hold "
        f"this model's values: export with --precision fp32 (or int8 / int4, whose activations "
        f"stay float32)"
    )


def check_finite(paths: dict, inputs: dict, got: dict) -> None:
    """Every float output of every case is finite; else a ParityError naming the first node (and the
    layer whose weights it reads) that produced an inf or NaN, found by re-running that case with
    every activation exposed. float16 graphs overflow this way (a DFlash drafter's residual stream
    can pass 65,504: vLLM #55250)."""
    for graph, cases in got.items():
        for case, outs in enumerate(cases):
            if all(np.isfinite(o).all() for o in outs if o is not None and o.dtype.kind == "f"):
                continue
            where = (
                first_non_finite(paths[graph], inputs[graph][case])
                if graph in inputs
                else "a cached step"
            )
            raise ParityOverflow(
                f"graph {graph!r} overflows: inf/NaN first at {where}; float16 activations cannot "
                "hold "
                f"this model's values: export with --precision fp32 (or int8 / int4, whose "
                f"activations stay float32)"
            )


def first_non_finite(path, feeds: tuple) -> str:
    """The first node (graph order) of the graph at `path` whose float output holds an inf or NaN on
    `feeds`."""

    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path), load_external_data=False)
    inputs = [i.name for i in model.graph.input]
    feeds = [f for f in feeds if f is not None]  # tensors the graph lacks (io_tables `when`)
    known = {o.name for o in model.graph.output}
    order = [(n, o) for n in model.graph.node for o in n.output if o and o not in known]
    model.graph.output.extend(onnx.ValueInfoProto(name=o) for _, o in order)
    # beside its external data
    fd, probe = tempfile.mkstemp(suffix=".onnx", dir=os.path.dirname(path))
    os.close(fd)
    try:
        onnx.save_model(model, probe)
        names = [o for _, o in order]
        values = ort.InferenceSession(probe, providers=["CPUExecutionProvider"]).run(
            names, dict(zip(inputs, feeds))
        )
    finally:
        os.unlink(probe)
    last_weight = None
    for (node, _), value in zip(order, values):
        weights = [i for i in node.input if i.startswith(("model.", "layers."))]
        last_weight = weights[0] if weights else last_weight
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            return f"node {node.name} ({node.op_type}), after the weight {last_weight}"
    return "an output only"

"""Trace one graph module to ONNX with the names and dynamic axes its I/O table declares."""
from __future__ import annotations

import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from dflash_edge.runtime.io_tables import DYNAMIC_SYMBOLS, GRAPHS, resolve_shape

from .external_data import SharedData, write_external

OPSET = 17
_TORCH_DTYPES = {"int64": torch.int64, "float32": torch.float32, "float16": torch.float16}


def dummy_inputs(graph: str, dims: dict[str, int], kv_dtype: str = "float32") -> tuple[torch.Tensor, ...]:
    """Example inputs for tracing: every symbol resolved from `dims` (dynamic ones given sample sizes)."""
    out = []
    for spec in GRAPHS[graph]["inputs"]:
        shape = resolve_shape(spec, dims)
        dtype = _TORCH_DTYPES[kv_dtype if spec.dtype == "kv" else spec.dtype]
        if spec.name == "start":
            out.append(torch.tensor([dims["S"]], dtype=dtype))
        elif dtype == torch.int64:
            out.append(torch.randint(0, dims["V"], shape, dtype=dtype))
        else:
            out.append(torch.randn(shape, dtype=dtype))
    return tuple(out)


def dynamic_axes(graph: str) -> dict[str, dict[int, str]]:
    axes = {}
    for side in ("inputs", "outputs"):
        for spec in GRAPHS[graph][side]:
            dyn = {i: s for i, s in enumerate(spec.shape) if s in DYNAMIC_SYMBOLS}
            if dyn:
                axes[spec.name] = dyn
    return axes


def export_graph(module: torch.nn.Module, graph: str, dims: dict[str, int], path: Path,
                 shared: "SharedData | None" = None) -> Path:
    """Write `path` (+ `path.data` external weights) for `graph`; returns the .onnx path.

    The exporter's own output (one file per tensor above 2 GB) goes to a scratch folder that is
    removed; weights are then copied into `path.data` one tensor at a time (tensors `shared` holds go
    to its file instead, once for every graph), so the bundle holds only the files its manifest names.
    """
    import onnx

    names = {side: [s.name for s in GRAPHS[graph][side]] for side in ("inputs", "outputs")}
    scratch = Path(tempfile.mkdtemp(prefix=f".{graph}.raw-", dir=path.parent))
    try:
        raw = scratch / "raw.onnx"
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")   # the TorchScript exporter's deprecation and tracer notes
            torch.onnx.export(module.eval(), dummy_inputs(graph, dims), str(raw), dynamo=False, opset_version=OPSET,
                              input_names=names["inputs"], output_names=names["outputs"],
                              dynamic_axes=dynamic_axes(graph), do_constant_folding=True)
        model = onnx.load(str(raw), load_external_data=False)
        share_transposed_weights(model, scratch)
        write_external(model, scratch, path, graph, shared)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    onnx.checker.check_model(str(path))
    return path


def share_transposed_weights(model, base_dir: Path | None = None) -> int:
    """Store a tied embedding once: MatMul(x, W^T-copy) -> Gemm(x, W, transB=1) on the original W.

    The TorchScript exporter constant-folds `lm_head`'s transpose into a second initializer, which
    doubles the largest tensor of a tied model (113 MB for SmolLM2). Returns how many were shared.
    """
    import numpy as np
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer if len(i.dims) == 2 and i.dims[0] * i.dims[1] >= 1 << 16}
    base = None if base_dir is None else str(base_dir)
    by_shape = {}
    for name, init in inits.items():
        by_shape.setdefault(tuple(init.dims), []).append(name)
    shared, drop = 0, set()
    for idx, node in enumerate(model.graph.node):
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        b = inits[node.input[1]]
        for cand in by_shape.get((b.dims[1], b.dims[0]), []):
            if np.array_equal(numpy_helper.to_array(inits[cand], base).T, numpy_helper.to_array(b, base)):
                gemm = helper.make_node("Gemm", [node.input[0], cand], list(node.output), name=node.name + "_shared",
                                        transB=1)
                model.graph.node.remove(node)
                model.graph.node.insert(idx, gemm)
                drop.add(b.name)
                shared += 1
                break
    still_used = {x for n in model.graph.node for x in n.input}
    for name in drop - still_used:
        model.graph.initializer.remove(inits[name])
    return shared

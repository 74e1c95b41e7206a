"""MatMul(x, const W) -> MatMulNBits, one weight at a time, with onnxruntime's own block quantiser (RTN).

The same nodes and tensors as onnxruntime's `MatMulNBitsQuantizer` (default algorithm, QOperator format)
writes for a 2-D weight: `W_Q{bits}` [N, K/bs, bs*bits/8] uint8, `W_scales` [N, K/bs], `W_zero_points`
when asymmetric, node `NAME_Q{bits}` with K, N, bits, block_size (+ accuracy_level when set); the weight's
graph input is dropped and unused initializers are removed. Unlike that quantiser it never needs the
model's weights in memory: each W is read from `weights` (a memory map when streaming), quantised, and
its packed form handed back to `weights` (appended to the new data file) before the next one is read.

>>> n = quantize_matmuls(model, QuantSettings(), bits=4, weights=weights)   # doctest: +SKIP
"""
from __future__ import annotations

import numpy as np

from dflash_edge.models.nbits import pack_blocks  # noqa: F401  (the quantiser's own RTN blocks, shared with export)

from .precisions import QuantSettings

MS = "com.microsoft"


def _quantize_weight(init, settings: QuantSettings, bits: int, weights) -> tuple[list, dict]:
    """The new initializers for weight `init` [K, N] and the MatMulNBits attributes."""
    k, n = init.dims
    packed, scales, zero_points = pack_blocks(weights.array(init), bits, settings.block_size, settings.symmetric)
    weights.done(init)
    tensors = [weights.put(packed, f"{init.name}_Q{bits}"), weights.put(scales, f"{init.name}_scales")]
    if not settings.symmetric:
        tensors.append(weights.put(zero_points, f"{init.name}_zero_points"))
    attrs = {"K": k, "N": n, "bits": bits, "block_size": settings.block_size}
    if settings.accuracy_level:                 # unset when 0, as onnxruntime's quantiser leaves it
        attrs["accuracy_level"] = settings.accuracy_level
    return tensors, attrs


def quantize_matmuls(model, settings: QuantSettings, bits: int, weights) -> int:
    """Every MatMul on a 2-D float initializer -> MatMulNBits, in place; returns how many were replaced."""
    from onnx import TensorProto, helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    done: dict[str, tuple[list[str], dict]] = {}          # a weight two MatMuls share is quantised once
    nodes, replaced = [], 0
    for node in graph.node:
        init = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if init is None or len(init.dims) != 2 or init.data_type != TensorProto.FLOAT:
            nodes.append(node)
            continue
        if init.name not in done:
            tensors, attrs = _quantize_weight(init, settings, bits, weights)
            graph.initializer.extend(tensors)
            done[init.name] = ([t.name for t in tensors], attrs)
        names, attrs = done[init.name]
        nodes.append(helper.make_node("MatMulNBits", [node.input[0], *names], [node.output[0]], domain=MS,
                                      name=f"{node.name}_Q{bits}" if node.name else "", **attrs))
        replaced += 1
    graph.ClearField("node")
    graph.node.extend(nodes)
    for inp in [i for i in graph.input if i.name in done]:
        graph.input.remove(inp)
    drop_unused_initializers(graph)
    set_opset(model, MS, 1)
    return replaced


def drop_unused_initializers(graph) -> None:
    """Remove initializers no node reads and no output names (and their graph inputs), as onnxruntime's
    quantiser does after replacing nodes."""
    wanted = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    unused = [i for i in graph.initializer if i.name not in wanted]
    names = {i.name for i in unused}
    for init in unused:
        graph.initializer.remove(init)
    for inp in [i for i in graph.input if i.name in names]:
        graph.input.remove(inp)


def set_opset(model, domain: str, version: int) -> None:
    for opset in model.opset_import:
        if opset.domain == domain:
            opset.version = version
            return
    from onnx import helper

    model.opset_import.append(helper.make_opsetid(domain, version))

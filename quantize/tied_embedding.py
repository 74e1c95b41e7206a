"""The embedding table [V, H] (and the LM head on the same initializer) in 4- or 8-bit blocks, stored once.

The exporter's LM head is `Gemm(x, W, transB=1)` on the embedding `Gather`'s own initializer
(`export/portable_target.py:lm_head`). A [V, H] weight used with transB is MatMulNBits'
[N, K] layout, so one packed tensor `[V, H/bs, bs*bits/8]` (onnxruntime's own block quantiser,
symmetric, default zero point 2^(bits-1)) feeds both:

    Gather(W, ids)            -> GatherBlockQuantized(Wq, ids, scales[V, H/bs, 1])  # [*ids, H/bs, bs]
                                 -> Reshape(concat(Shape(ids), [H]))                 # [*ids, H]
    Gemm(x, W, transB=1)      -> MatMulNBits(x, Wq, scales[V, H/bs])                 # [M, V]

The two ops want the scales in different ranks, so only the (small) scales are stored twice.

>>> n = quantize_tied_embedding(model, bits=4, block_size=32, accuracy_level=4)   # doctest: +SKIP
"""
from __future__ import annotations

import numpy as np

MS = "com.microsoft"


def _attr(node, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return a.i if a.type == a.INT else a.f
    return default


def _plain_gemm_head(node, name: str) -> bool:
    """Gemm(x, name, transB=1) with no bias and unit scaling: exactly x @ name^T."""
    return (node.op_type == "Gemm" and len(node.input) == 2 and node.input[1] == name
            and _attr(node, "transB", 0) == 1 and _attr(node, "transA", 0) == 0 and _attr(node, "alpha", 1.0) == 1.0)


def _plain_gather(node, name: str) -> bool:
    return node.op_type == "Gather" and node.input[0] == name and _attr(node, "axis", 0) == 0


def block_quantize(weight: np.ndarray, bits: int, block_size: int, rows: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """[N, K] float -> (packed uint8 [N, K/bs, bs*bits/8], scales float32 [N, K/bs]), symmetric, `rows` rows at a
    time (models/nbits.rtn: the whole table is never transposed at once)."""
    from dflash_edge.models.nbits import rtn

    w = rtn(weight, bits, block_size, symmetric=True, rows=rows)
    return w.B, w.scales


def quantize_tied_embedding(model, bits: int, block_size: int, accuracy_level: int, weights=None) -> list[str]:
    """Replace every Gather / Gemm(transB) reading a [V, H] initializer by its block-quantised form.

    `weights` reads the table and stores the new tensors (tensor_io.py; default: in the model itself).
    Returns the names of the initializers replaced (empty when the graph has none or H % block_size != 0).
    """
    from onnx import helper

    from .tensor_io import InModel

    weights = weights or InModel()

    graph = model.graph
    inits = {i.name: i for i in graph.initializer if len(i.dims) == 2}
    done = []
    for name, init in inits.items():
        gathers = [n for n in graph.node if _plain_gather(n, name)]
        heads = [n for n in graph.node if _plain_gemm_head(n, name)]
        users = [n for n in graph.node if name in n.input]
        v, h = init.dims
        if not gathers or len(gathers) + len(heads) != len(users) or h % block_size:
            continue
        packed, scales = block_quantize(weights.array(init), bits, block_size)
        weights.done(init)
        q, s_head, s_gather, width = f"{name}_Q{bits}", f"{name}_scales", f"{name}_gather_scales", f"{name}_width"
        graph.initializer.extend([weights.put(packed, q), weights.put(scales, s_head),
                                  weights.put(scales[:, :, None], s_gather),            # [V, H/bs, 1]
                                  weights.put(np.array([h], np.int64), width)])
        del packed, scales
        for node in gathers:
            out, ids, base = node.output[0], node.input[1], node.name or node.output[0]
            new = [helper.make_node("GatherBlockQuantized", [q, ids, s_gather], [out + "_blocks"], domain=MS,
                                    name=base + "_q", gather_axis=0, quantize_axis=2, block_size=block_size,
                                    bits=bits),                                     # [*ids, H/bs, bs]
                   helper.make_node("Shape", [ids], [out + "_ids_shape"], name=base + "_shape"),
                   helper.make_node("Concat", [out + "_ids_shape", width], [out + "_shape"], axis=0,
                                    name=base + "_concat"),
                   helper.make_node("Reshape", [out + "_blocks", out + "_shape"], [out],
                                    name=base + "_reshape")]                   # [*ids, H]
            _replace(graph, node, new)
        for node in heads:
            kwargs = {"accuracy_level": accuracy_level} if accuracy_level else {}
            _replace(graph, node, [helper.make_node("MatMulNBits", [node.input[0], q, s_head], list(node.output),
                                                    domain=MS, name=(node.name or node.output[0]) + "_q", K=h, N=v, bits=bits,
                                                    block_size=block_size, **kwargs)])
        graph.initializer.remove(init)
        done.append(name)
    if done and not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    return done


def _replace(graph, node, new: list) -> None:
    idx = list(graph.node).index(node)
    graph.node.remove(node)
    for offset, n in enumerate(new):
        graph.node.insert(idx + offset, n)

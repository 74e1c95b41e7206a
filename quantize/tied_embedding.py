"""The embedding table [V, H] (and the LM head on the same initializer) in 4- or 8-bit blocks, stored once.

The exporter's LM head is `Gemm(x, W, transB=1)` on the embedding `Gather`'s own initializer
(`export/onnx_export.py:share_transposed_weights`). A [V, H] weight used with transB is MatMulNBits'
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


def block_quantize(weight: np.ndarray, bits: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """[N, K] float32 -> (packed uint8 [N, K/bs, bs*bits/8], scales float32 [N, K/bs]), symmetric."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits, quantize_matmul_8bits

    n, k = weight.shape
    k_blocks = k // block_size
    packed = np.zeros((n, k_blocks, block_size * bits // 8), np.uint8)
    scales = np.zeros((n, k_blocks), np.float32)
    zero_points = np.zeros((n, (k_blocks * bits + 7) // 8), np.uint8)    # unused: symmetric
    fn = {4: quantize_matmul_4bits, 8: quantize_matmul_8bits}[bits]
    fn(packed, np.ascontiguousarray(weight.T), scales, zero_points, block_size, n, k, True)  # takes [K, N]
    return packed, scales


def quantize_tied_embedding(model, bits: int, block_size: int, accuracy_level: int) -> list[str]:
    """Replace every Gather / Gemm(transB) reading a [V, H] initializer by its block-quantised form.

    Returns the names of the initializers replaced (empty when the graph has none or H % block_size != 0).
    """
    from onnx import helper, numpy_helper

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
        packed, scales = block_quantize(numpy_helper.to_array(init).astype(np.float32), bits, block_size)
        q, s_head, s_gather, width = f"{name}_Q{bits}", f"{name}_scales", f"{name}_gather_scales", f"{name}_width"
        graph.initializer.extend([numpy_helper.from_array(packed, q), numpy_helper.from_array(scales, s_head),
                                  numpy_helper.from_array(scales[:, :, None], s_gather),   # [V, H/bs, 1]
                                  numpy_helper.from_array(np.array([h], np.int64), width)])
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

"""int4: weight-only 4-bit blocks (MatMul -> MatMulNBits, onnxruntime's quantiser) + the tied embedding.

Every MatMul with a constant [K, N] weight becomes MatMulNBits (symmetric, `block_size` weights per
scale along K, `accuracy_level` 4 = int8 activations: the fast CPU kernel). Activations are quantised
per row and block, so a token's logits do not depend on the other tokens of its step (verify == decode).

Streamed (`weights` given, tensor_io.py) each MatMul weight is quantised on its own by onnxruntime's
block quantiser (matmul_nbits.py); in memory (`weights` None: the graph loaded with its data, the path
`--algorithm hqq` takes) onnxruntime's MatMulNBitsQuantizer rewrites the whole graph.

>>> info = quantize(model, QuantSettings())     # doctest: +SKIP
"""
from __future__ import annotations

from .precisions import QuantSettings
from .tied_embedding import quantize_tied_embedding


def quantize_matmuls(model, settings: QuantSettings, bits: int, weights=None) -> int:
    """MatMul(x, const W) -> MatMulNBits(x, Wq, scales) in place; returns how many were replaced."""
    if weights is not None:
        from . import matmul_nbits

        return matmul_nbits.quantize_matmuls(model, settings, bits, weights)
    return quantize_matmuls_in_memory(model, settings, bits)


def quantize_matmuls_in_memory(model, settings: QuantSettings, bits: int) -> int:
    """onnxruntime's MatMulNBitsQuantizer over the whole (loaded) graph: RTN or HQQ."""
    import logging

    from onnx import helper
    from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig, MatMulNBitsQuantizer

    before = sum(n.op_type == "MatMul" for n in model.graph.node)
    logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
    hqq = HQQWeightOnlyQuantConfig(settings.block_size, bits, op_types_to_quantize=("MatMul",)) \
        if settings.algorithm == "hqq" else None
    quant = MatMulNBitsQuantizer(model, bits=bits, block_size=settings.block_size, is_symmetric=settings.symmetric,
                                 accuracy_level=settings.accuracy_level or None, op_types_to_quantize=("MatMul",),
                                 algo_config=hqq)
    quant.process()
    model.CopyFrom(quant.model.model)
    for node in model.graph.node:                 # HQQ's nodes carry no accuracy level: give them ours
        if node.op_type == "MatMulNBits" and settings.accuracy_level and not any(
                a.name == "accuracy_level" for a in node.attribute):
            node.attribute.append(helper.make_attribute("accuracy_level", settings.accuracy_level))
    return before - sum(n.op_type == "MatMul" for n in model.graph.node)


def quantize(model, settings: QuantSettings, weights=None) -> dict:
    """Quantise `model` to int4 in place, its data in the model (`weights` None) or streamed; returns what was done."""
    return quantize_nbits(model, settings, 4, weights)


def quantize_nbits(model, settings: QuantSettings, bits: int, weights=None) -> dict:
    """MatMul weights to `bits`-bit MatMulNBits blocks, the tied embedding to `settings.embedding_bits` (0: `bits`)."""
    emb_bits = bits if settings.embedding_bits == 0 else settings.embedding_bits
    tied = quantize_tied_embedding(model, emb_bits, settings.block_size, settings.accuracy_level, weights) \
        if emb_bits > 0 else []
    return {"matmul_nbits": quantize_matmuls(model, settings, bits, weights), "embedding": tied,
            "embedding_bits": emb_bits if tied else 32}

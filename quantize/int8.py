"""int8: weight-only 8-bit blocks (onnxruntime's MatMulNBitsQuantizer, bits=8) + the tied embedding.

Why not `quantize_dynamic`: it quantises each MatMul's activations with ONE scale per tensor, and
SmolLM2's hidden states carry outlier channels (|x| up to ~25,000) that flatten every other channel;
measured on SmolLM2-135M it kept only 73.7% top-1 agreement with fp32 and decoded slower than fp32
(docs/BENCHMARKS.md, issue 12). A per-tensor scale also makes a token's logits depend on the other
tokens of its step, so a verify block would not reproduce plain decoding. MatMulNBits quantises
activations per row and block (accuracy_level 4), keeping each token independent.

>>> info = quantize(model, QuantSettings())     # doctest: +SKIP
"""
from __future__ import annotations

from .int4 import quantize_nbits
from .precisions import QuantSettings


def quantize(model, settings: QuantSettings, weights=None) -> dict:
    """Quantise `model` to int8 in place, its data in the model (`weights` None) or streamed; returns what was done."""
    return quantize_nbits(model, settings, 8, weights)

"""fp16: weights and most compute in float16 (onnxruntime's float16 converter); I/O stays float32.

RMSNorm's Pow/ReduceMean/Sqrt/Div, Softmax and the final ArgMax run in float32 (fp16 sums of
squares overflow and softmax loses the tail); graph inputs and outputs keep float32, so the KV
cache and the runtime's buffers are unchanged.

>>> info = quantize(model, QuantSettings())     # doctest: +SKIP
"""
from __future__ import annotations

from .precisions import QuantSettings

KEEP_FP32 = ("Pow", "ReduceMean", "Sqrt", "Div", "Softmax", "ArgMax", "Range", "CumSum")


def quantize(model, settings: QuantSettings) -> dict:
    """Convert `model` to float16 in place (settings unused: fp16 has no knobs); returns what was done."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    block = sorted(set(DEFAULT_OP_BLOCK_LIST) | set(KEEP_FP32))
    converted = convert_float_to_float16(model, keep_io_types=True, op_block_list=block, disable_shape_infer=True)
    model.CopyFrom(converted)
    return {"kept_fp32_ops": list(KEEP_FP32)}

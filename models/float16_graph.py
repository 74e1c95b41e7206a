"""An ONNX graph in float16: weights and most compute, I/O kept float32 (onnxruntime's float16
converter).

RMSNorm's Pow/ReduceMean/Sqrt/Div, Softmax and the final ArgMax run in float32 (fp16 sums of squares
overflow and softmax loses the tail); graph inputs and outputs keep float32, so the KV cache and the
runtime's buffers are unchanged. Shared by the exporter's fp16 writer and `dflash-edge quantize
--target fp16`.

>>> info = convert(model)     # doctest: +SKIP
"""

from __future__ import annotations

KEEP_FP32 = ("Pow", "ReduceMean", "Sqrt", "Div", "Softmax", "ArgMax", "Range", "CumSum")


def convert(model) -> dict:
    """Convert `model` to float16 in place; returns what was done. Initializers stored outside the
    proto must already be float16 (the converter only rewrites the bytes it holds)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    block = sorted(set(DEFAULT_OP_BLOCK_LIST) | set(KEEP_FP32))
    from onnx import TensorProto

    half = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT16]
    for t in half:  # typed as the float32 graph they stand in for while the types are inferred
        t.data_type = TensorProto.FLOAT
    try:
        record_types(model)
    finally:
        for t in half:
            t.data_type = TensorProto.FLOAT16
    converted = convert_float_to_float16(
        model,
        keep_io_types=True,
        op_block_list=block,
        node_block_list=external_float_readers(model),
        disable_shape_infer=True,
    )
    model.CopyFrom(converted)
    return {"kept_fp32_ops": list(KEEP_FP32)}


def external_float_readers(model) -> list[str]:
    """Names of the nodes that read a float32 initializer stored outside the proto: kept float32
    (the converter would have to read and rewrite its bytes). An fp16 drafter beside a low-bit
    target reads the shared 8-bit tables this way: their float32 scales lie in shared.onnx.data,
    the target's too."""
    from onnx import TensorProto

    external = {
        t.name
        for t in model.graph.initializer
        if t.data_type == TensorProto.FLOAT and t.data_location == TensorProto.EXTERNAL
    }
    return [n.name for n in model.graph.node if external.intersection(n.input)]


def record_types(model) -> None:
    """Give every intermediate tensor a value_info entry: the converter inserts its Casts around the
    fp32 ops only where it knows an input's type, and a graph written node by node (the streamed
    export) has none. Shape inference runs on the graph with its large initializers' bytes set aside
    (any size of model).

    >>> record_types(model); len(model.graph.value_info) > 0     # doctest: +SKIP
    True
    """
    import onnx

    g = model.graph
    known = {v.name for v in (*g.value_info, *g.input, *g.output)}
    if all(o in known for n in g.node for o in n.output if o):
        return
    stash = {}
    for t in g.initializer:  # dims and type stay: all inference needs of a weight
        if t.HasField("raw_data") and len(t.raw_data) > 4096:
            stash[t.name] = t.raw_data
            t.ClearField("raw_data")
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    finally:
        for t in g.initializer:
            if t.name in stash:
                t.raw_data = stash[t.name]
    g.value_info.extend(v for v in inferred.graph.value_info if v.name not in known)

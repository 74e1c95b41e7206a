"""Lower one graph to int4/int8 without loading its weights: proto alone, weights streamed tensor by tensor.

The graph is read with `load_external_data=False`; each MatMul weight and the tied embedding is read
from a memory map of the source bundle's data files, quantised, and its packed form appended to the new
`NAME.onnx.data` before the next is read; the tensors left as they were are then copied over one at a
time. Peak memory is the graph's proto plus the largest tensor's working set, whatever the model's size.
Graphs this path cannot take (fp16's converter and `--algorithm hqq` rewrite a loaded graph; subgraphs;
MatMul weights that are not 2-D float32) load whole as before (`streamable` says why).

>>> model = onnx.load("b/target.onnx", load_external_data=False)                      # doctest: +SKIP
>>> if streamable(model, "int4", settings) is None:                                    # doctest: +SKIP
...     files, info = lower_graph(model, Path("b"), Path("tmp/target.onnx"), int4.quantize, settings, index)
"""
from __future__ import annotations

from pathlib import Path

from .dedupe import TensorIndex
from .precisions import QuantSettings

STREAMED = ("int4", "int8")


def streamable(model, want: str, settings: QuantSettings) -> str | None:
    """None when graph `model` (its proto) can be lowered to `want` tensor by tensor, else why not."""
    from onnx import AttributeProto, TensorProto

    if want not in STREAMED:
        return f"{want}: onnxruntime's float16 converter rewrites the loaded graph"
    if settings.algorithm != "rtn":
        return f"--algorithm {settings.algorithm}: onnxruntime's HQQ quantiser rewrites the loaded graph"
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute):
            return f"node {node.name!r} ({node.op_type}) holds a subgraph"
        w = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if w is not None and (len(w.dims) != 2 or w.data_type != TensorProto.FLOAT):
            return f"MatMul weight {w.name!r} is not a 2-D float32 matrix"
    return None


def lower_graph(model, src_dir: Path, out: Path, quantize, settings: QuantSettings, index: TensorIndex):
    """Write `model` (a streamable proto whose data files lie in `src_dir`) lowered by `quantize` (a family's
    `quantize(model, settings, weights)`) as `out` + `out.data`; returns (its files relative to out's folder,
    then other graphs' data files it now references; what was done)."""
    from .graph_io import save_graph
    from .tensor_io import SourceTensors, Streamed, TensorSink

    originals = {i.name for i in model.graph.initializer}
    data = out.name + ".data"
    with SourceTensors(src_dir) as source, TensorSink(out.parent, data, index) as sink:
        info = quantize(model, settings, Streamed(source, sink))
        sink.copy_rest(model, source, originals)
        borrowed = sorted(sink.borrowed)
    return [*save_graph(model, out), *borrowed], info

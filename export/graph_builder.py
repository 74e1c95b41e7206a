"""One ONNX graph written node by node with `onnx.helper`; its weights go straight to a
`WeightStore`.

The graph's inputs and outputs come from `runtime/io_tables.py` (names, dtypes, shapes with
symbols), so a written graph has exactly the I/O contract the runtime, the TensorRT profiles and the
tests expect.

>>> g = GraphBuilder("drafter", store)                                   # doctest: +SKIP
>>> y = g.op("MatMul", ["x", g.init("w.T", lambda: w.T)])  # doctest: +SKIP
>>> g.save(Path("b/drafter.onnx"), dims, opsets={"": 17})               # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..runtime.errors import DflashEdgeError
from ..runtime.io_tables import GRAPHS, expand_specs
from ..runtime.tensor_file import INLINE_BELOW
from .weight_format import MS, FormatLog, WeightFormat
from .weight_store import ONNX_DTYPES, WeightStore

OPSET_DQ = 21  # blocked DequantizeLinear, int4 / uint4 (low-bit weights in standard ops)
ACCURACY_KEY = "onnxruntime.qdq_matmulnbits_accuracy_level"  # metadata: the session option to set
OPSET = 17  # the portable graphs: standard ONNX ops TensorRT parses
OPSET_FUSED = (
    23  # target_fused: RMSNormalization is standard from opset 23 (onnxruntime's fused kernel)
)


class GraphBuilder:
    """Nodes + initializers of graph `graph`; every helper returns output names."""

    def __init__(self, graph: str, store: WeightStore, fmt=None, log=None):
        self.graph, self.store = graph, store
        # how weights are stored; what was done
        self.fmt, self.log = (
            fmt or WeightFormat(),
            log or FormatLog(),
        )
        self.memo: dict = {}  # per-graph shared nodes (block sums)
        self.nodes, self.inits, self._n = [], [], 0
        self._consts: dict[tuple, str] = {}
        self._names: set[str] = set()
        store.open_graph(graph)

    def op(
        self, op_type: str, inputs: list[str], out: str | None = None, domain: str = "", **attrs
    ) -> str:
        """Append a one-output node and return its output's name (`out`, or a fresh one). `attrs`:
        ONNX attributes. Example: `y = g.op("MatMul", [x, w])`."""
        return self.ops(op_type, inputs, [out] if out else 1, domain, **attrs)[0]

    def ops(
        self, op_type: str, inputs: list[str], outs: int | list[str], domain: str = "", **attrs
    ) -> list[str]:
        """Append a node with several outputs: `outs` is how many to name automatically, or their
        names. Example: `q, k, v = g.ops("Split", [qkv, sizes], 3, axis=-1)`."""
        from onnx import helper

        self._n += 1
        if isinstance(outs, int):
            outs = [f"{op_type}_{self._n}_{k}" for k in range(outs)]
        self.nodes.append(
            helper.make_node(
                op_type, inputs, outs, name=f"{op_type}_{self._n}", domain=domain, **attrs
            )
        )
        return outs

    def init(self, name: str, make, shared: str | None = None) -> str:
        """An initializer: `make` (array or function returning one) is only evaluated if `name` is
        not stored yet; a name this graph already holds is referenced again (one initializer per
        name)."""
        if name in self._names:
            return name
        self._names.add(name)
        if self.fmt.precision == "fp16":  # stored as float16; the converter at `save` does the rest
            make = _half(make, name)
        self.inits.append(self.store.tensor(self.graph, name, make, shared))
        return name

    def const(self, values, dtype=np.int64) -> str:
        """A small constant (shape vector, axes, scalar when `values` is a number), created once per
        value."""
        array = np.asarray(values, dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            self._consts[key] = self.init(f"const_{len(self._consts)}", array)
        return self._consts[key]

    def scalar(self, value: float) -> str:
        return self.const(value, np.float32)

    def save(self, out: Path, dims: dict[str, int], opsets: dict[str, int]) -> Path:
        """Write the graph (I/O from io_tables, fixed symbols resolved from `dims`) to `out`;
        weights are already stored."""
        import onnx
        from onnx import helper

        spec = GRAPHS[self.graph]

        def value_info(side):  # dynamic symbols (T, S, C, Smax) stay named dims
            return [
                helper.make_tensor_value_info(
                    t.name,
                    ONNX_DTYPES["float32" if t.dtype == "kv" else t.dtype],
                    [int(d) if d.isdigit() else dims.get(d, d) for d in t.shape],
                )
                for t in expand_specs(spec[side], dims)
            ]

        # low-bit weights: MatMulNBits / GatherBlockQuantized
        if any(n.domain == MS for n in self.nodes):
            opsets = {MS: 1, **opsets}
        blocked = any(n.op_type == "DequantizeLinear" for n in self.nodes)
        if blocked and opsets.get("", OPSET) < OPSET_DQ:  # low-bit weights in standard ops
            opsets = {**opsets, "": OPSET_DQ}  # (dq_format.py): opset 21
            self._axes_as_inputs()
        graph = helper.make_graph(
            self.nodes, self.graph, value_info("inputs"), value_info("outputs"), self.inits
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
            producer_name="dflash-edge",
        )
        # the oldest IR the opsets allow (not onnx's newest): older onnxruntime / TensorRT parsers
        # refuse a newer IR than they know (onnxruntime 1.26 reads IR <= 13; onnx 1.23 writes 14)
        model.ir_version = helper.find_min_ir_version_for(model.opset_import, ignore_unknown=True)
        if blocked:  # what onnxruntime's fused MatMulNBits computes with
            helper.set_model_props(model, {ACCURACY_KEY: str(self.fmt.accuracy_level)})
        if self.fmt.precision == "fp16":
            from ..models.float16_graph import convert

            convert(model)
        onnx.save_model(model, str(out))
        return out

    def _axes_as_inputs(self) -> None:
        """Reduce* nodes written with an `axes` attribute (opset 17) take it as an input, as opset
        18 on wants (ReduceSum already did from 13)."""
        from onnx import helper

        for i, node in enumerate(self.nodes):
            axes = [a for a in node.attribute if a.name == "axes"]
            if not node.op_type.startswith("Reduce") or not axes:
                continue
            attrs = {
                a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "axes"
            }
            inputs = [*node.input, self.const(list(axes[0].ints))]
            self.nodes[i] = helper.make_node(
                node.op_type, inputs, list(node.output), name=node.name, **attrs
            )


class Float16Overflow(DflashEdgeError):
    """A graph's weights or activations pass float16's range (the export's fallback for a drafter
    made fp16 by default catches it: exporter.py)."""


def _half(make, name: str):
    """`make` with float32 weights of INLINE_BELOW bytes or more cast to float16 (smaller ones stay
    inline in the proto, where the float16 converter casts them itself)."""

    def made():
        array = make() if callable(make) else make
        if array.dtype != np.float32 or array.nbytes < INLINE_BELOW:
            return array
        peak = float(np.abs(array).max(initial=0.0))
        if not peak <= float(np.finfo(np.float16).max):
            raise Float16Overflow(
                f"weight {name} holds {peak:.3g}, beyond float16's range (65,504): it cannot be "
                f"stored in fp16; export with --precision fp32, int8 or int4"
            )
        return array.astype(np.float16)

    return made

"""Will TensorRT's ONNX parser take this graph? A static check against `trt_support` (no TensorRT
needed).

>>> report = check_trt_readiness("bundle/target.onnx")      # doctest: +SKIP
>>> report.ok, report.problems                               # doctest: +SKIP
(True, [])
>>> bundle_trt_readiness("bundle/")["ok"]                   # doctest: +SKIP
True
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..runtime.bundle import inside
from ..runtime.io_tables import portable_graphs
from . import op_support as sup

STANDARD_DOMAINS = ("", "ai.onnx")


@dataclass
class Report:
    """Readiness of one graph: `problems` stop a TensorRT build; `notes` are worth knowing."""

    graph: str
    opset: int | None
    ops: dict[str, int] = field(default_factory=dict)  # op type -> count
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> dict:
        """JSON-able record for a manifest."""
        return {
            "ok": self.ok,
            "opset": self.opset,
            "nodes": sum(self.ops.values()),
            "op_types": len(self.ops),
            "problems": list(self.problems),
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        head = (
            f"{self.graph}: {'ready' if self.ok else 'NOT ready'} for TensorRT "
            f"{sup.SOURCE['tensorrt_version']} (opset {self.opset}, {sum(self.ops.values())} nodes)"
        )
        return "\n".join(
            [head]
            + [f"  problem: {p}" for p in self.problems]
            + [f"  note: {n}" for n in self.notes]
        )


def check_trt_readiness(model, name: str | None = None) -> Report:
    """Check every op, dtype and the opset of `model` (an .onnx path or a ModelProto) against the
    table."""
    import onnx

    if isinstance(model, (str, Path)):
        name = name or Path(model).stem
        model = onnx.load(str(model), load_external_data=False)  # weights are not needed
    report = Report(name or model.graph.name or "graph", _default_opset(model))
    _check_opset(model, report)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as err:  # noqa: BLE001 - inference is best effort; the op check still runs
        report.notes.append(
            f"shape inference failed ({err}); dtypes of intermediate tensors not checked"
        )
        inferred = model
    types = _tensor_types(inferred.graph)
    _check_io(inferred.graph, types, report)
    _check_graph(inferred.graph, types, report, set())
    report.ops = dict(Counter(report.ops).most_common())
    return report


def bundle_trt_readiness(bundle_dir: str | Path) -> dict:
    """Check every portable graph of a bundle: {tensorrt_version, table, ok, graphs: name ->
    summary} (`dflash-edge export` prints it in one line).

    Graphs come from `manifest.json` when present, otherwise every `*.onnx` in the directory. A
    bundle with a TensorRT flavour (export/tensorrt_flavour.py) is judged by that flavour's graphs:
    `flavour` names its folder.
    """
    root = Path(bundle_dir)
    mpath = root / "manifest.json"
    flavour = trt_flavour(root)
    if flavour is not None:
        return {**bundle_trt_readiness(flavour), "flavour": str(flavour)}
    if mpath.is_file():
        graphs = {
            n: inside(root, g["files"][0]["path"], f"graphs.{n}.files[0].path")
            for n, g in json.loads(mpath.read_text())["graphs"].items()
        }
    else:
        graphs = {p.stem: p for p in sorted(root.glob("*.onnx"))}
    # TensorRT never sees fused ones
    reports = {n: check_trt_readiness(graphs[n], n) for n in portable_graphs(graphs)}
    return {
        "tensorrt_version": sup.SOURCE["tensorrt_version"],
        "table": sup.SOURCE["url"],
        "ok": all(r.ok for r in reports.values()),
        "graphs": {n: r.summary() for n, r in reports.items()},
    }


def trt_flavour(root: Path) -> Path | None:
    """The folder of a bundle's TensorRT flavour (its manifest's `flavours.tensorrt`), if any."""
    mpath = Path(root) / "manifest.json"
    if not mpath.is_file():
        return None
    entry = (json.loads(mpath.read_text()).get("flavours") or {}).get("tensorrt")
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        return None
    return inside(Path(root), entry["path"], "flavours.tensorrt.path")


def _default_opset(model) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in STANDARD_DOMAINS), None)


def _check_opset(model, report: Report) -> None:
    lo, hi, portable = (
        sup.SOURCE["opset_min"],
        sup.SOURCE["opset_max"],
        sup.SOURCE["portable_opset_max"],
    )
    v = report.opset
    if v is None:
        report.problems.append("the model imports no standard ONNX opset")
    elif not lo <= v <= hi:
        report.problems.append(
            f"opset {v} is outside TensorRT {sup.SOURCE['tensorrt_version']}'s range "
            f"{lo}..{hi}; re-export with an opset in that range (the exporter uses 17)"
        )
    elif v > portable:
        report.notes.append(
            f"opset {v} > {portable}: older TensorRT 10.x parsers (e.g. 10.3 on JetPack 6) may "
            f"reject it; export with opset <= {portable} for Jetson"
        )
    for o in model.opset_import:
        if o.domain not in STANDARD_DOMAINS and o.domain != "ai.onnx.ml":
            report.notes.append(f"imports custom domain {o.domain!r} (version {o.version})")


def _tensor_types(graph) -> dict[str, str]:
    """tensor name -> ONNX element type name, from inputs, outputs, value_info and initializers."""
    from onnx import TensorProto

    out = {}
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            out[vi.name] = TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
    for init in graph.initializer:
        out[init.name] = TensorProto.DataType.Name(init.data_type)
    return out


def _check_io(graph, types: dict[str, str], report: Report) -> None:
    int64 = []
    for vi in list(graph.input) + list(graph.output):
        onnx_t = types.get(vi.name)
        trt_t = sup.ONNX_TO_TRT.get(onnx_t)
        if onnx_t is None:
            report.notes.append(f"graph I/O {vi.name!r} has no element type")
        elif trt_t is None:
            report.problems.append(
                f"graph I/O {vi.name!r} is {onnx_t}, which TensorRT does not support; "
                f"export it as FLOAT/FLOAT16/INT32/INT64/BOOL"
            )
        elif trt_t in sup.CAST_DOWN_TYPES:
            report.notes.append(f"graph I/O {vi.name!r}: {sup.CAST_DOWN_TYPES[trt_t]}")
        elif onnx_t == "INT64":
            int64.append(vi.name)
    if int64:
        report.notes.append(
            f"INT64 graph I/O {int64}: TensorRT 10 binds INT64 natively (8.x cast it to INT32); "
            f"INT32 ids would halve their bytes"
        )


@dataclass
class _Scan:
    """What the node checks of one graph read (tensor types, constant names, initializer dims)
    and write (the report; `seen`: keys reported once already, shared with its subgraphs)."""

    types: dict[str, str]
    consts: set
    dims: dict[str, list[int]]
    report: Report
    seen: set

    def once(self, key: str, kind: str, text: str) -> None:
        """Report `text` as a "problem" or a note, the first time `key` comes up."""
        if key not in self.seen:
            self.seen.add(key)
            (self.report.problems if kind == "problem" else self.report.notes).append(text)


def _check_graph(graph, types: dict[str, str], report: Report, seen: set) -> None:
    consts = {i.name for i in graph.initializer} | {
        o for n in graph.node if n.op_type == "Constant" for o in n.output
    }
    dims = {i.name: list(i.dims) for i in graph.initializer}
    scan = _Scan(types, consts, dims, report, seen)
    for node in graph.node:
        op = node.op_type if node.domain in STANDARD_DOMAINS else f"{node.domain}::{node.op_type}"
        report.ops[op] = report.ops.get(op, 0) + 1
        _check_node(node, op, scan)
        for attr in node.attribute:  # If / Loop / Scan bodies: check their ops too
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _check_graph(sub, {**types, **_tensor_types(sub)}, report, seen)


def _check_node(node, op: str, scan: _Scan) -> None:
    where = f"node {node.name or node.output[0]!r}"
    if node.domain not in STANDARD_DOMAINS:
        scan.once(
            op,
            "problem",
            f"{op} ({where}) is not a standard ONNX op: TensorRT needs a plugin "
            "for it; export without custom ops (e.g. onnxruntime contrib ops are "
            "onnxruntime-only)",
        )
        return
    if op in sup.UNSUPPORTED or op not in sup.OPS:
        why = "documented as unsupported" if op in sup.UNSUPPORTED else "not in its operator table"
        scan.once(
            op,
            "problem",
            f"{op} ({where}) is {why} for TensorRT "
            f"{sup.SOURCE['tensorrt_version']}; rewrite it with supported ops or add a plugin",
        )
        return
    if op in sup.CONTROL_FLOW:
        scan.once(
            "cf:" + op,
            "problem",
            f"{op} ({where}) is control flow: the graph's path depends on "
            f"runtime values/shapes; export with static block shapes so tracing removes it",
        )
    if op in sup.DATA_DEPENDENT_SHAPE:
        scan.once(
            "dds:" + op,
            "note",
            f"{op} has a data-dependent output shape (slow in TensorRT)",
        )
    _check_restrictions(node, op, where, scan)
    _check_dtype(node, op, where, scan)
    if op == "DequantizeLinear":
        _check_weight_only(node, where, scan)


def _check_weight_only(node, where: str, scan: _Scan) -> None:
    """Blocked / low-bit DequantizeLinear against TensorRT's weight-only rules (op_support)."""
    from onnx import helper

    qtype = sup.ONNX_TO_TRT.get(scan.types.get(node.input[0], ""))
    rule = sup.WEIGHT_ONLY.get(qtype)
    if rule is None:  # a type TensorRT does not dequantize: _check_dtype names it
        return
    block = next(
        (helper.get_attribute_value(a) for a in node.attribute if a.name == "block_size"), 0
    )
    if len(node.input) > 2 and node.input[2]:
        scan.once(
            f"wo-zp:{qtype}",
            "problem",
            f"{qtype} DequantizeLinear ({where}) has a zero point: TensorRT dequantizes "
            "symmetrically only (zero point 0)",
        )
    axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 1)
    shape = scan.dims.get(node.input[0])
    if block and shape and shape[axis] % block:
        scan.once(
            f"wo-partial:{qtype}:{block}",
            "problem",
            f"{qtype} DequantizeLinear ({where}): {shape[axis]} weights along its blocked axis are "
            f"no whole number of blocks of {block} (TensorRT's blocks must tile the axis)",
        )
    if block and block not in rule["blocks"]:
        takes = (
            f"in blocks of {' or '.join(str(b) for b in rule['blocks'])} only"
            if rule["blocks"]
            else "with one scale per tensor or per channel only, not in blocks"
        )
        scan.once(
            f"wo-block:{qtype}:{block}",
            "problem",
            f"{qtype} DequantizeLinear ({where}) in blocks of {block}: TensorRT takes {qtype} "
            f"weights {takes} (a GGUF's own blocks are 32 / 16 wide; re-quantised TensorRT blocks "
            "are not written yet)",
        )
    scan.once(
        f"wo:{qtype}",
        "note",
        f"{qtype} weight-only DequantizeLinear: TensorRT >= {rule['since']}, a strongly typed "
        "network (build-engines sets it); not built here",
    )
    if node.input[0] not in scan.consts:
        scan.once(
            f"wo-computed:{qtype}",
            "note",
            f"{qtype} DequantizeLinear ({where}) of a computed tensor (embedding rows gathered "
            "before dequantising): unverified with TensorRT",
        )


def _check_restrictions(node, op: str, where: str, scan: _Scan) -> None:
    """Check the restrictions that a static look can decide; note the others once per op."""
    for table, kind in ((sup.CONST_INPUTS, "problem"), (sup.SOFT_CONST_INPUTS, "note")):
        if op in table:
            idx, rule = table[op]
            name = node.input[idx] if len(node.input) > idx else ""
            if name and name not in scan.consts:
                scan.once(
                    f"c:{op}:{name}",
                    kind,
                    f"{op} ({where}): {rule}, but input {name!r} is computed; constant-fold it at "
                    "export",
                )
    bad = [a.name for a in node.attribute if a.name in sup.BAD_ATTRIBUTES.get(op, ())]
    if bad:
        scan.report.problems.append(
            f"{op} ({where}) uses attribute(s) {bad}, which TensorRT does not support"
        )
    checked = op in sup.CONST_INPUTS or op in sup.SOFT_CONST_INPUTS or op in sup.BAD_ATTRIBUTES
    if op in sup.RESTRICTIONS and not checked:
        scan.once(
            "r:" + op,
            "note",
            f"{op}: {sup.RESTRICTIONS[op]} (not checked statically)",
        )


def _check_dtype(node, op: str, where: str, scan: _Scan) -> None:
    side, idx = sup.TYPED_TENSOR.get(op, ("input", 0))
    names = node.input if side == "input" else node.output
    tensors = [names[idx]] if len(names) > idx and names[idx] else []
    if op in ("Cast", "CastLike"):
        tensors.append(node.output[0])
    allowed = sup.OPS[op].split()
    for tensor in tensors:
        onnx_t = scan.types.get(tensor)
        if onnx_t is None:
            continue  # unknown after inference: nothing to check
        trt_t = sup.ONNX_TO_TRT.get(onnx_t, onnx_t)
        if trt_t in allowed:
            continue
        if op == "Gather" and trt_t in sup.GATHER_LAYER_TYPES:
            scan.once(
                f"g:{trt_t}",
                "note",
                f"Gather ({where}) on {onnx_t}: onnx-tensorrt's table lists no {onnx_t}; "
                "TensorRT's Gather layer takes it (operators/Gather.html); unverified here",
            )
        elif trt_t == "INT64" and "INT32" in allowed:
            scan.once(
                f"i64:{op}",
                "note",
                f"{op} ({where}) on INT64: the table lists INT32 only, "
                f"so TensorRT casts INT64 to INT32 (values beyond +-2^31 would clamp)",
            )
        elif trt_t == "DOUBLE":
            scan.once(
                f"f64:{op}",
                "note",
                f"{op} ({where}) on DOUBLE: {sup.CAST_DOWN_TYPES['DOUBLE']}",
            )
        else:
            scan.once(
                f"t:{op}:{trt_t}",
                "problem",
                f"{op} ({where}) on {onnx_t}: TensorRT "
                f"{sup.SOURCE['tensorrt_version']} supports {op} on {', '.join(allowed)} only; "
                "cast it at export",
            )

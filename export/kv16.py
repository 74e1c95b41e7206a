"""A 16-bit KV cache for the graphs written with a float32 one (`export --device` on a GPU / Jetson:
export/choices.py): each cache input becomes float16 and is cast to float32 where the graph reads
it, each cache output is cast to float16 where the graph writes it, so the graph's arithmetic (and
its parity, checked before this rewrite) is unchanged and the cache the runtime holds, reads and
writes is half the bytes. A graph with its own cache (the fused target's calibrated int8) keeps it;
the manifest's bundle-wide `kv_cache.dtype` becomes float16 (runtime/bundle.py `graph_kv_dtype`).

An fp16 graph already casts its float32 cache edges to float16 (models/float16_graph.py keeps the
I/O float32); here those edges get a float16 -> float32 -> float16 pair, exact, which TensorRT and
onnxruntime's graph optimiser fold.

>>> apply_kv16(tmp, manifest)["kv_cache"]["dtype"]     # doctest: +SKIP
'float16'
"""

from __future__ import annotations

from pathlib import Path

from ..runtime.bundle import file_entry
from ..runtime.io_tables import GRAPHS, KV

KV16 = "float16"


def cache_names(graph: str) -> set[str]:
    """The names (templates such as `past_key.{i}` stripped of their index) of graph `graph`'s cache
    tensors: io_tables' specs of the bundle's KV dtype."""
    specs = (*GRAPHS[graph]["inputs"], *GRAPHS[graph]["outputs"])
    return {s.name.split("{")[0] for s in specs if s.dtype == KV}


def is_cache(name: str, names: set[str]) -> bool:
    """`name` is one of `names` (a per-layer tensor `past_key.3` matches the prefix `past_key.`)."""
    return name in names or any(n.endswith(".") and name.startswith(n) for n in names)


def kv16_graph(model, graph: str, round_new: bool = True) -> int:
    """Rewrite the proto `model` of bundle graph `graph` (loaded without its external data) for a
    float16 cache in place; returns how many cache tensors changed. `round_new`: a float32 graph's
    new keys and values are rounded to float16 where they join the cached ones (`_round_new`)."""
    from onnx import TensorProto, helper

    g, names = model.graph, cache_names(graph)
    inputs = [i for i in g.input if is_cache(i.name, names) and _is_float(i)]
    outputs = [o for o in g.output if is_cache(o.name, names) and _is_float(o)]
    rename = {v.name: f"{v.name}.fp32" for v in (*inputs, *outputs)}
    for node in g.node:
        node.input[:] = [rename.get(x, x) for x in node.input]
        node.output[:] = [rename.get(x, x) for x in node.output]
    cast = helper.make_node
    casts_in = [cast("Cast", [i.name], [rename[i.name]], to=TensorProto.FLOAT) for i in inputs]
    casts_out = [cast("Cast", [rename[o.name]], [o.name], to=TensorProto.FLOAT16) for o in outputs]
    body = _round_new(list(g.node), {rename[i.name] for i in inputs}) if round_new else g.node
    nodes = [*casts_in, *body, *casts_out]  # topological: the input casts run first
    del g.node[:]
    g.node.extend(nodes)
    kept = [v for v in g.value_info if v.name not in rename]
    del g.value_info[:]
    g.value_info.extend(kept)
    for v in (*inputs, *outputs):
        v.type.tensor_type.elem_type = TensorProto.FLOAT16
    return len(rename)


LAYOUT_OPS = ("Cast", "Split", "Squeeze", "Unsqueeze", "Reshape", "Transpose", "Slice", "Gather")


def _round_new(nodes: list, cached: set[str]) -> list:
    """`nodes` with every tensor that a Concat appends to the cached keys / values (its input 0
    read from `cached` through layout ops only) rounded through float16 first: a verify's tokens
    then attend to each other's keys as a later decode reads them from the cache, and drafting
    changes no token of plain decoding (row-exact, as the int8 fused cache is)."""
    from onnx import TensorProto, helper

    past, rounded, out = set(cached), {}, []
    for node in nodes:
        if node.op_type in LAYOUT_OPS and node.input and node.input[0] in past:
            past.update(node.output)
        if node.op_type == "Concat" and node.input[0] in past:
            for k, name in enumerate(node.input[1:], start=1):
                if name not in rounded:  # once per tensor, however many Concats read it
                    rounded[name] = half = f"{name}.kv16"
                    out.append(helper.make_node("Cast", [name], [half], to=TensorProto.FLOAT16))
                    out.append(helper.make_node("Cast", [half], [half + ".fp32"], to=1))
                node.input[k] = rounded[name] + ".fp32"
        out.append(node)
    return out


def _is_float(value_info) -> bool:
    from onnx import TensorProto

    return value_info.type.tensor_type.elem_type == TensorProto.FLOAT


def apply_kv16(root, manifest: dict) -> dict:
    """Give every graph of bundle `root` (being written) whose cache is the bundle's float32 one a
    float16 cache; returns `manifest` with those graphs' entries (file hash, I/O dtypes) and the
    bundle's `kv_cache.dtype` updated (the caller writes it)."""
    import onnx

    root = Path(root)
    for name, entry in manifest["graphs"].items():
        if name not in GRAPHS or "kv_cache" in entry:  # its own cache (int8) stays
            continue
        rel = entry["files"][0]["path"]
        model = onnx.load(str(root / rel), load_external_data=False)
        kv16_graph(model, name, round_new=entry["precision"] != "fp16")
        tmp = root / f"{rel}.tmp"
        onnx.save(model, str(tmp))
        tmp.replace(root / rel)
        entry["files"][0] = file_entry(root, rel)
        names = cache_names(name)
        for spec in (*entry["io"]["inputs"], *entry["io"]["outputs"]):
            if is_cache(spec["name"].split("{")[0], names):
                spec["dtype"] = KV16
    manifest["kv_cache"]["dtype"] = KV16
    return manifest

"""An int8 KV cache for the fused target (`--kv-cache int8`): 4x fewer cache bytes, no pad row.

onnxruntime's CPU GroupQueryAttention keeps its cache as int8 with one static scale per channel
(`k_quant_type` / `v_quant_type` PER_CHANNEL, `kv_cache_bit_width` 8, `k_scale` / `v_scale` of shape
[Hkv * D]): each new K/V row is stored as clip(rint(x / scale), -128, 127) and attention reads the
cache dequantised. Two measured facts make it worth having on CPU (docs/BENCHMARKS.md, "Fused
attention"): attention over 1,800 cached positions costs ~half of the fp32 cache's, and a decode row
(T = 1) equals the same row of a verify block bit for bit without the fp32 graph's zero pad row, so
the pad is removed.

The exporter calibrates it on the graph it has just written, in its temp folder (write_int8_cache).
Scales come from the bundle's own fused target run with its fp32 cache over held-out text: the
largest |K| / |V| per layer and channel (post-rotary K, as the cache holds it) times `margin`, over
127. The text is teacher-forced (calibration_texts: 4 x 128 tokens of held-out prompts, in prefill
chunks; nothing decoded): seconds, where 16 prompts' greedy replies took minutes. Losslessness
stays against the bundle's own target: decode and verify read the same int8 cache.

`calibrate` returns two [L, Hkv * D] arrays; `int8_cache_graph` rewrites the proto in place:

>>> k, v = calibrate(gen, texts)                       # doctest: +SKIP
>>> info = int8_cache_graph(model, k, v)               # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data import read_prompts
from ..runtime import Generator
from ..runtime.bundle import file_entry, read_bundle
from ..runtime.errors import DflashEdgeError
from ..runtime.io_tables import io_manifest

KV_CACHES = ("fp32", "int8")
GQA = "GroupQueryAttention"
# scale = margin * max|x| / 127 over the calibration text (0.8 / 1.0 / 1.25 measured on 2,147
# greedy positions; 1.25 / 1.5 on the 512 teacher-forced ones: 1.5 gives the same KL to the fp32
# cache as the greedy 1.25 did, docs/BENCHMARKS.md "Calibration from prefill")
MARGIN = 1.5
# calibration text: COUNT teacher-forced texts of LENGTH tokens from the last POOL prompts
# (calibration_texts; LENGTH a multiple of the default prefill chunk, 64)
COUNT, LENGTH, POOL = 4, 128, 16


class KVCacheError(DflashEdgeError, ValueError):
    """A KV cache request the exporter cannot honour (the message names the fix)."""


def check_kv_cache(name: str) -> str:
    if name not in KV_CACHES:
        raise KVCacheError(f"unknown --kv-cache {name!r}; choose one of {', '.join(KV_CACHES)}")
    return name


def graph_kv_cache(entry: dict) -> str:
    """The cache a manifest graph entry runs with: "int8" when quantised, else "fp32" (the bundle's
    dtype)."""
    return "int8" if entry.get("kv_cache", {}).get("dtype") == "int8" else "fp32"


def check_request(precision: str, kv_cache: str) -> None:
    """A KVCacheError (naming the fix) when an int8 cache cannot go with a `precision` target."""
    if check_kv_cache(kv_cache) == "int8" and precision == "fp16":
        raise KVCacheError(
            "--kv-cache int8 needs an fp32, int8 or int4 target: the fp16 fused "
            "graph casts its cache at the graph's edge (it is meant for GPU "
            "providers); pass --kv-cache fp32 or another --precision"
        )


def teacher_forced_logits(gen, ids: list[int], rows: slice) -> np.ndarray:
    """Logits [rows, V] of the target on `ids` run in prefill chunks from an empty cache (row i
    predicts i+1)."""
    size, n = gen.prefill_chunk, len(ids)
    out = np.empty((n, gen.bundle.model["vocab_size"]), np.float32)  # [n, V]
    for start in range(0, n, size):
        chunk = ids[start : start + size]
        step = gen.target.step(len(chunk))  # logits on every row
        step["input_ids"][0] = chunk
        gen.target.forward(len(chunk), start)
        out[start : start + len(chunk)] = step["logits"][0]
    gen.target.kv.pos = 0
    return out[rows]


def calibrate(gen, texts: list[list[int]], margin: float = MARGIN) -> tuple[np.ndarray, np.ndarray]:
    """Per layer and channel scales (k, v), each [L, Hkv * D], from `gen`'s fused target on `texts`
    (token ids).

    `gen` is a Generator on the fused target with an fp32 cache; each text is run in prefill chunks
    and the rows it wrote are read back from the cache (`LayerKV`: [L, Hkv, capacity, D])."""
    kv = gen.target.kv
    layers, heads, _, dim = kv.key.array.shape
    peak = [np.zeros((layers, heads, dim), np.float32) for _ in range(2)]  # max |K|, max |V|
    for ids in texts:
        ids = ids[: kv.capacity - gen.prefill_chunk]
        teacher_forced_logits(gen, ids, slice(0, 0))
        for acc, buf in zip(peak, (kv.key.array, kv.value.array)):
            np.maximum(acc, np.abs(buf[:, :, : len(ids)]).max(axis=2), out=acc)  # [L, Hkv, D]
    tiny = np.finfo(np.float32).tiny
    return tuple(np.maximum(p * margin / 127.0, tiny).reshape(layers, heads * dim) for p in peak)


def _consumers(graph) -> dict[str, list]:
    users: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            users.setdefault(name, []).append(node)
    return users


def _drop_pad_row(graph, node, producers: dict, users: dict) -> None:
    """Concat(qkv, zero row) -> GQA -> Slice(rows 0:-1), lengths + 1  becomes  qkv -> GQA, lengths
    as given."""
    concat = producers.get(node.input[0])
    slices = users.get(node.output[0], [])
    if (
        concat is None
        or concat.op_type != "Concat"
        or len(slices) != 1
        or slices[0].op_type != "Slice"
    ):
        raise KVCacheError(
            f"{node.name or node.output[1]}: the fused target's attention is not the "
            f"pad-row form this quantiser rewrites; re-export the bundle with this version"
        )
    node.input[0] = concat.input[0]
    node.output[0] = slices[0].output[0]  # the o_proj reads what the Slice produced
    graph.node.remove(slices[0])
    for slot, graph_input in ((5, "seqlens_k"), (6, "total_sequence_length")):
        add = producers.get(node.input[slot])
        if add is None or add.op_type != "Add" or graph_input not in add.input:
            raise KVCacheError(
                f"{node.output[1]}: lengths input {slot} is not {graph_input} + 1; re-export the "
                "bundle"
            )
        node.input[slot] = graph_input


def _prune(graph) -> int:
    """Remove nodes (and then initializers) nothing reads any more; returns how many nodes went."""
    removed = 0
    while True:
        used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        dead = [n for n in graph.node if not any(o in used for o in n.output if o)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
        removed += len(dead)
    used = {name for node in graph.node for name in node.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)
    return removed


def int8_cache_graph(model, k_scales: np.ndarray, v_scales: np.ndarray) -> dict:
    """Rewrite a fused target proto (loaded without its external data) for an int8 cache; returns
    its info."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    users = _consumers(graph)
    nodes = [n for n in graph.node if n.op_type == GQA]
    if len(nodes) != len(k_scales):
        raise KVCacheError(
            f"the fused target has {len(nodes)} {GQA} nodes but {len(k_scales)} layers were "
            f"calibrated; re-export the bundle"
        )
    if any(a.name == "kv_cache_bit_width" for n in nodes for a in n.attribute):
        raise KVCacheError(
            "the fused target's cache is already quantised; quantise the fp32 bundle instead"
        )
    for node in nodes:
        i = int(node.output[1].rsplit(".", 1)[1])  # present_key.{i}
        _drop_pad_row(graph, node, producers, users)
        graph.initializer.extend(
            [
                numpy_helper.from_array(k_scales[i].astype(np.float32), f"kv.k_scale.{i}"),
                numpy_helper.from_array(v_scales[i].astype(np.float32), f"kv.v_scale.{i}"),
            ]
        )
        # position_ids, attention_bias, head_sink
        inputs = list(node.input) + [""] * (12 - len(node.input))
        del node.input[:]
        node.input.extend([*inputs[:12], f"kv.k_scale.{i}", f"kv.v_scale.{i}"])
        node.attribute.extend(
            [
                helper.make_attribute("k_quant_type", "PER_CHANNEL"),
                helper.make_attribute("v_quant_type", "PER_CHANNEL"),
                helper.make_attribute("kv_cache_bit_width", 8),
            ]
        )
    for value in [*graph.input, *graph.output]:
        if value.name.startswith(("past_key.", "past_value.", "present_key.", "present_value.")):
            value.type.tensor_type.elem_type = TensorProto.INT8
    removed = _prune(graph)
    return {
        "dtype": "int8",
        "quant": "per_channel",
        "bits": 8,
        "pad_rows": 0,
        "nodes_removed": removed,
    }


def calibration_texts(
    gen, prompts: list[str], count: int, length: int, pool: int = POOL
) -> list[list[int]]:
    """`count` teacher-forced texts of `length` tokens from the last `pool` prompts (the quality
    report reads from the first): text i is pool prompt i * pool // count in the chat template,
    then as its reply the text of the pool prompts after it, round robin, cut at `length` tokens.
    Nothing is decoded: prefill chunks alone run them (docs/BENCHMARKS.md, "Calibration from
    prefill")."""
    chosen = prompts[-pool:]
    texts = []
    for i in range(min(count, len(chosen))):
        first = i * len(chosen) // min(count, len(chosen))
        ids = gen.encode(chosen[first])
        for k in range(1, 4 * length):  # every prompt encodes to at least a token
            if len(ids) >= length:
                break
            ids += gen.tokenizer.encode("\n\n" + chosen[(first + k) % len(chosen)])
        texts.append(ids[:length])
    return texts


def load_prompts(spec: str | Path | None) -> list[str]:
    """Prompt texts of a JSONL file or a shipped prompt set (default: the held-out prompts)."""
    try:
        return [row["prompt"] for row in read_prompts(spec, default="heldout")]
    except ValueError as err:
        raise KVCacheError(str(err)) from err


@dataclass(frozen=True)
class Calibration:
    """How the int8 cache is calibrated: `count` texts of up to `length` tokens, scales widened by
    `margin`."""

    count: int = COUNT
    length: int = LENGTH
    margin: float = MARGIN


def write_int8_cache(
    root, manifest: dict, prompts: list[str], *, plan: Calibration = Calibration(), threads: int = 0
) -> dict:
    """Give bundle `root`'s fused target (fp32 cache) an int8 cache in place; returns its new entry.

    `root` is a bundle being written (the exporter's temp folder), `manifest` its manifest.
    """
    t = time.perf_counter()
    # the target alone
    gen = Generator.load(
        read_bundle(root, verify=False),
        target_graph="target_fused",
        threads=threads,
        use_tuned=False,
        drafter=False,
    )
    room = gen.target.kv.capacity - gen.prefill_chunk  # what calibrate runs of a text
    texts = calibration_texts(gen, prompts, plan.count, min(plan.length, room))
    k_scales, v_scales = calibrate(gen, texts, plan.margin)
    del gen
    calibration = {
        "texts": len(texts),
        "positions": sum(map(len, texts)),
        "teacher_forced": True,
        "seconds": round(time.perf_counter() - t, 1),
    }
    return apply_int8_cache(root, manifest, k_scales, v_scales, plan.margin, calibration)


def apply_int8_cache(
    root, manifest: dict, k_scales, v_scales, margin: float, calibration: dict
) -> dict:
    """Rewrite bundle `root`'s fused target for an int8 cache with these scales; returns its new
    manifest entry (the caller writes the manifest)."""
    import onnx

    root = Path(root)
    entry = manifest["graphs"]["target_fused"]
    path = root / entry["files"][0]["path"]
    model = onnx.load(str(path), load_external_data=False)
    info = int8_cache_graph(model, k_scales, v_scales)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)
    return {
        **entry,
        "files": [file_entry(root, entry["files"][0]["path"]), *entry["files"][1:]],
        "io": io_manifest("target_fused", "int8"),
        "kv_cache": {**info, "margin": margin, "calibration": calibration},
    }

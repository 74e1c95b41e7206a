"""Every bundle graph's inputs and outputs, declared once, as data (docs/design.md §3).

Shapes use named symbols. Dims fixed by the model (L, Hkv, D, V, H, N, B) are resolved from the
manifest; the rest (T, S, C) vary per call and become dynamic axes / TensorRT profile ranges.
From this table come: dummy inputs (`dummy_inputs`), ONNX input/output names and dynamic axes, the
runtime's preallocated buffers and bindings, the TensorRT profiles and the manifest's I/O section.

KV layout is sequence-major, `[S, L, Hkv, D]`: the live prefix of a preallocated `[S_max, L, Hkv,
D]` buffer is a contiguous view (bound as input without a copy) and the slot for the new tokens
`[pos : pos + T]` is contiguous too (bound as output: the graph writes new K/V straight into the
cache).

`target_fused` is a second flavour of the target (issue 12): onnxruntime's `GroupQueryAttention`
over per-layer head-major buffers `[1, Hkv, Smax, D]`, each bound as both `past_key.{i}` and
`present_key.{i}` (same pointer: the op appends the new rows in place and never copies the prefix).
Only onnxruntime runs it; TensorRT builds its engines from the portable `target` (FLAVOURS below).
"""

from __future__ import annotations

from dataclasses import dataclass

KV = "kv"  # placeholder dtype: the manifest's kv_dtype


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "int64" | "float32" | "float16" | KV
    shape: tuple[str, ...]  # symbols or literal ints as strings
    per: str | None = None  # "L": one tensor per layer, `name` formatted with {i} (expand_specs)
    when: str | None = None  # "Ld" / "Lw": present only where that dim is > 0 (`present`)


# Symbols: T new target tokens (1 decode, B verify, P prefill chunk); R of them whose logits the
# graph computes (the rows from `logits_from` on: T in a verify, 1 in a prefill chunk); S cached
# positions; C new context positions for the drafter; L/Ld target/drafter layers; Hkv kv heads; D
# head dim; V vocab; H hidden; N = len(target_layer_ids) * H context-feature width; B block size;
# Bm1 = B - 1; Smax the capacity of a preallocated per-layer KV buffer (fixed per load: the
# runtime's buffer size). A drafter with sliding-window layers (models/draft_config.py) caches Ld
# full layers for every position and Lw sliding layers for the Wm1 = W-1 positions before `start`
# only (a static window; rows before position 0 are empty and masked), so a sliding layer's memory
# and cost stop growing with the context.
GRAPHS: dict[str, dict[str, tuple[TensorSpec, ...]]] = {
    "target": {
        "inputs": (
            TensorSpec("input_ids", "int64", ("1", "T")),
            TensorSpec("logits_from", "int64", ("1",)),  # T - R: the first row with logits
            TensorSpec("start", "int64", ("1",)),  # position of input_ids[0]
            TensorSpec("past_key", KV, ("S", "L", "Hkv", "D")),  # S == start
            TensorSpec("past_value", KV, ("S", "L", "Hkv", "D")),
        ),
        "outputs": (
            TensorSpec("logits", "float32", ("1", "R", "V")),
            TensorSpec("next_ids", "int64", ("1", "R")),  # fused argmax (greedy fast path)
            TensorSpec("hidden", "float32", ("1", "T", "N")),  # drafter context features
            TensorSpec("new_key", KV, ("T", "L", "Hkv", "D")),
            TensorSpec("new_value", KV, ("T", "L", "Hkv", "D")),
        ),
    },
    "target_fused": {
        "inputs": (
            TensorSpec("input_ids", "int64", ("1", "T")),
            TensorSpec("logits_from", "int64", ("1",)),
            TensorSpec("seqlens_k", "int32", ("1",)),  # start + T - 1 (GQA: total length - 1)
            TensorSpec("total_sequence_length", "int32", ()),  # start + T
            # rows [0:start] are live
            TensorSpec("past_key.{i}", KV, ("1", "Hkv", "Smax", "D"), per="L"),
            TensorSpec("past_value.{i}", KV, ("1", "Hkv", "Smax", "D"), per="L"),
        ),
        "outputs": (
            TensorSpec("logits", "float32", ("1", "R", "V")),
            TensorSpec("next_ids", "int64", ("1", "R")),
            TensorSpec("hidden", "float32", ("1", "T", "N")),
            # the past buffer, rows
            TensorSpec("present_key.{i}", KV, ("1", "Hkv", "Smax", "D"), per="L"),
            # [start:start+T] written
            TensorSpec("present_value.{i}", KV, ("1", "Hkv", "Smax", "D"), per="L"),
        ),
    },
    "drafter": {
        "inputs": (
            TensorSpec("block_ids", "int64", ("1", "B")),  # [last token, MASK x (B-1)]
            # features of positions not yet cached
            TensorSpec("ctx_hidden", "float32", ("1", "C", "N")),
            TensorSpec("start", "int64", ("1",)),  # position of ctx_hidden[0]
            TensorSpec("past_key", KV, ("S", "Ld", "Hkv", "D"), when="Ld"),  # S == start
            TensorSpec("past_value", KV, ("S", "Ld", "Hkv", "D"), when="Ld"),
            # positions start-W+1 .. start-1
            TensorSpec("window_key", KV, ("Wm1", "Lw", "Hkv", "D"), when="Lw"),
            TensorSpec("window_value", KV, ("Wm1", "Lw", "Hkv", "D"), when="Lw"),
        ),
        "outputs": (
            # greedy draft tokens for positions 1..B-1
            TensorSpec("draft_ids", "int64", ("1", "Bm1")),
            # context K/V only: block K/V
            TensorSpec("new_key", KV, ("C", "Ld", "Hkv", "D"), when="Ld"),
            TensorSpec("new_value", KV, ("C", "Ld", "Hkv", "D"), when="Ld"),  # is dropped
            TensorSpec("new_window_key", KV, ("C", "Lw", "Hkv", "D"), when="Lw"),
            TensorSpec("new_window_value", KV, ("C", "Lw", "Hkv", "D"), when="Lw"),
            # a DFlash2 drafter's lattice (models/dflash2.py; walked by runtime/lattice.py): Kc
            # candidates per draft position and the score of each (previous, this) candidate pair
            TensorSpec("candidate_ids", "int64", ("1", "Bm1", "Kc"), when="Kc"),
            TensorSpec("lattice_scores", "float32", ("1", "Bm1", "Kc", "Kc"), when="Kc"),
        ),
    },
    # A hybrid (Qwen3.5) target, export/hybrid_target.py (runtime wrapper:
    # targets.HybridTargetModel). Lf full-attention layers cache K/V as `target` does; the Ll Gated
    # DeltaNet layers carry no per-token state: each call gets the states at the previous call's
    # start (`*_base`), that call's per-token rows (Tp of them) and how many it `kept` (all after a
    # prefill chunk, a + 1 after a verify accepting a drafts), rebuilds the states after those
    # tokens (`conv_start`, `rec_start`: one rank-kept update), runs its own T tokens and returns
    # their rows.
    # Rollback is the `kept` count: no state is re-run or stored per token
    # (models/linear_attention.py).
    "target_hybrid": {
        "inputs": (
            TensorSpec("input_ids", "int64", ("1", "T")),
            TensorSpec("logits_from", "int64", ("1",)),
            TensorSpec("start", "int64", ("1",)),
            TensorSpec("past_key", KV, ("S", "Lf", "Hkv", "D")),
            TensorSpec("past_value", KV, ("S", "Lf", "Hkv", "D")),
            TensorSpec("conv_base", "float32", ("Ll", "Cv", "Km1")),
            TensorSpec("rec_base", "float32", ("Ll", "Hv", "Dk", "Dv")),
            TensorSpec("prev_qkv", "float32", ("Tp", "Ll", "Cv")),  # conv inputs
            TensorSpec("prev_k", "float32", ("Tp", "Ll", "Hv", "Dk")),  # normalised keys
            TensorSpec("prev_u", "float32", ("Tp", "Ll", "Hv", "Dv")),  # delta-rule updates
            TensorSpec("prev_decay", "float32", ("Tp", "Ll", "Hv")),  # cumulative log decay
            TensorSpec("kept", "int64", ("1",)),  # 0 .. Tp
        ),
        "outputs": (
            TensorSpec("logits", "float32", ("1", "R", "V")),
            TensorSpec("next_ids", "int64", ("1", "R")),
            TensorSpec("hidden", "float32", ("1", "T", "N")),
            TensorSpec("new_key", KV, ("T", "Lf", "Hkv", "D")),
            TensorSpec("new_value", KV, ("T", "Lf", "Hkv", "D")),
            TensorSpec("conv_start", "float32", ("Ll", "Cv", "Km1")),  # the next call's bases
            TensorSpec("rec_start", "float32", ("Ll", "Hv", "Dk", "Dv")),
            TensorSpec("qkv", "float32", ("T", "Ll", "Cv")),  # the next call's prev_* rows
            TensorSpec("delta_k", "float32", ("T", "Ll", "Hv", "Dk")),
            TensorSpec("delta_u", "float32", ("T", "Ll", "Hv", "Dv")),
            TensorSpec("decay", "float32", ("T", "Ll", "Hv")),
        ),
    },
}

DYNAMIC_SYMBOLS = ("T", "R", "S", "C", "Smax", "Tp")
# What a spec's `when` dim is where a caller gives no dims: a drafter of full-attention layers only.
WHEN_DEFAULTS = {"Ld": 1, "Lw": 0, "Kc": 0}


def present(spec: TensorSpec, dims: dict[str, int] | None) -> bool:
    """Whether `spec` is in a graph with `dims` (a spec with `when` only where that dim is > 0)."""
    if spec.when is None:
        return True
    return bool((dims or {}).get(spec.when, WHEN_DEFAULTS[spec.when]))


@dataclass(frozen=True)
class Flavour:
    """What a graph is for: the loop's `role` and its `kind` ("portable": standard ONNX ops only,
    what TensorRT parses; "fused": onnxruntime contrib ops) and the KV dtypes each provider runs it
    with."""

    role: str
    kind: str
    providers: dict[str, tuple[str, ...]] | None = None  # None: every provider, every dtype


# onnxruntime registers GroupQueryAttention for float32 on CPU (with an fp32, fp16 or int8 cache)
# but only float16/bfloat16 on CUDA.
FLAVOURS = {
    "target": Flavour("target", "portable"),
    "drafter": Flavour("drafter", "portable"),
    "target_hybrid": Flavour("target", "portable"),
    "target_fused": Flavour(
        "target", "fused", {"cpu": ("float32", "float16", "int8"), "cuda": ("float16", "bfloat16")}
    ),
}


def portable_graphs(names) -> list[str]:
    """The graphs of `names` that TensorRT can build (unknown names count as portable)."""
    return [n for n in names if n not in FLAVOURS or FLAVOURS[n].kind == "portable"]


def pick_graph(names, role: str, provider: str, kv_dtype) -> str:
    """The graph of `names` that plays `role` on `provider`: a fused flavour where it runs, else the
    portable one.

    `kv_dtype`: the cache dtype of every graph (a str), or a mapping graph name -> its own.

    >>> pick_graph(["target", "target_fused", "drafter"], "target", "cpu", "float32")
    'target_fused'
    >>> pick_graph(["target", "target_fused", "drafter"], "target", "tensorrt", "float32")
    'target'
    >>> pick_graph(["target", "target_fused"], "target", "cuda",
    ...            {"target": "float32", "target_fused": "int8"})
    'target'
    """
    dtype = (lambda n: kv_dtype) if isinstance(kv_dtype, str) else kv_dtype.__getitem__  # noqa: E731
    fused = [
        n
        for n in names
        if n in FLAVOURS
        and FLAVOURS[n].role == role
        and FLAVOURS[n].kind == "fused"
        and dtype(n) in (FLAVOURS[n].providers or {}).get(provider, ())
    ]
    portable = [
        n
        for n in names
        if n in FLAVOURS and FLAVOURS[n].role == role and FLAVOURS[n].kind == "portable"
    ]
    # e.g. target_hybrid
    return fused[0] if fused else role if role in names or not portable else portable[0]


def expand_specs(specs, dims: dict[str, int]) -> list[TensorSpec]:
    """Per-layer specs expanded to one spec per layer (`past_key.{i}` -> past_key.0 ..
    past_key.{L-1}); specs not `present` with `dims` dropped."""
    out = []
    for spec in specs:
        if not present(spec, dims):
            continue
        if spec.per is None:
            out.append(spec)
        else:
            out += [
                TensorSpec(spec.name.format(i=i), spec.dtype, spec.shape, when=spec.when)
                for i in range(dims[spec.per])
            ]
    return out


def model_dims(manifest_model: dict, block_size: int) -> dict[str, int]:
    """Symbol -> size for the dims a manifest fixes (Ld: the drafter's full-attention layers, Lw its
    sliding ones)."""
    m = manifest_model
    sliding = window_layers(m)
    return {
        "L": m["num_layers"],
        "Ld": m["draft_num_layers"] - len(sliding),
        "Lw": len(sliding),
        "Wm1": m["draft_sliding_window"] - 1 if sliding else 0,
        "Hkv": m["num_kv_heads"],
        "D": m["head_dim"],
        "V": m["vocab_size"],
        "H": m["hidden_size"],
        "N": len(m["target_layer_ids"]) * m["hidden_size"],
        "B": block_size,
        "Bm1": block_size - 1,
        "Kc": m.get("draft_selector_top_k", 0),  # a DFlash2 drafter's candidates (0: DFlash1)
        **hybrid_dims(m),
    }


def hybrid_dims(manifest_model: dict) -> dict[str, int]:
    """A hybrid target's symbols (`target_hybrid`): Lf full-attention and Ll linear layers by the
    manifest's `layer_types`, the linear layers' conv channels Cv and taps Km1, value heads Hv and
    head dims Dk, Dv; {} else."""
    m = manifest_model
    kinds = m.get("layer_types")
    if not kinds:
        return {}
    hk, hv, dk, dv = (
        m[f"linear_{k}"]
        for k in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim")
    )
    return {
        "Lf": kinds.count("full_attention"),
        "Ll": kinds.count("linear_attention"),
        "Cv": 2 * hk * dk + hv * dv,
        "Km1": m["linear_conv_kernel_dim"] - 1,
        "Hv": hv,
        "Dk": dk,
        "Dv": dv,
    }


def window_layers(manifest_model: dict) -> list[int]:
    """The drafter's sliding-window layers by the manifest's `draft_layer_types` (absent: none
    slides)."""
    return [
        i
        for i, kind in enumerate(manifest_model.get("draft_layer_types") or [])
        if kind == "sliding_attention"
    ]


def resolve_shape(spec: TensorSpec, dims: dict[str, int]) -> tuple[int, ...]:
    """Concrete shape for `spec` given every symbol's size (KeyError names an unresolved symbol)."""
    return tuple(int(s) if s.isdigit() else dims[s] for s in spec.shape)


def numpy_dtype(dtype: str, kv_dtype: str) -> str:
    return kv_dtype if dtype == KV else dtype


def dummy_inputs(
    graph: str, dims: dict[str, int], kv_dtype: str = "float32", seed: int = 0
) -> dict:
    """Example feeds {name: numpy array} for a portable graph (`target`, `drafter`): every symbol
    resolved from `dims` (give the dynamic ones, T / S / C, sizes too); `start` is S (the new
    positions follow the past), ids are drawn from [0, V), floats from a standard normal.

    >>> feeds = dummy_inputs("target", {"T": 2, "S": 3, "L": 1, "Hkv": 1, "D": 4, "V": 10})
    >>> {n: a.shape for n, a in feeds.items()}
    {'input_ids': (1, 2), 'start': (1,), 'past_key': (3, 1, 1, 4), 'past_value': (3, 1, 1, 4)}
    >>> int(feeds["start"][0])
    3
    """
    import numpy as np

    rng, feeds = np.random.default_rng(seed), {}
    for spec in expand_specs(GRAPHS[graph]["inputs"], dims):
        shape, dtype = resolve_shape(spec, dims), numpy_dtype(spec.dtype, kv_dtype)
        if spec.name == "start":
            feeds[spec.name] = np.full(shape, dims["S"], dtype)
        elif spec.name == "logits_from":
            feeds[spec.name] = np.zeros(shape, dtype)  # logits for every row
        elif np.dtype(dtype).kind in "iu":
            feeds[spec.name] = rng.integers(0, dims["V"], shape).astype(dtype)
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def io_manifest(graph: str, kv_dtype: str, dims: dict[str, int] | None = None) -> dict:
    """The manifest's I/O section of one graph (`dims`: the model's, for the specs `present` only
    `when` a dim is > 0; without them, as for a drafter with full-attention layers only)."""
    return {
        side: [
            {
                "name": t.name,
                "dtype": numpy_dtype(t.dtype, kv_dtype),
                "shape": list(t.shape),
                **({"per": t.per} if t.per else {}),
            }
            for t in GRAPHS[graph][side]
            if present(t, dims)
        ]
        for side in ("inputs", "outputs")
    }

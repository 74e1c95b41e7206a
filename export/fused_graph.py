"""The fused-attention target graph (`target_fused`), written node by node with `onnx.helper`.

Per layer: SkipSimplifiedLayerNormalization (residual add + RMSNorm in one op; RMSNormalization where
there is no residual), one packed q/k/v MatMul, optional bias / per-head q/k RMSNorm, then onnxruntime's
`GroupQueryAttention` on the packed input with `do_rotary` and one zero row appended (see `_attention`)
(cos/sin tables from the family's `RotaryTable`, so llama3 / yarn scaling carry over) over a per-layer
head-major KV buffer `[1, Hkv, Smax, D]` that the runtime binds as both past and present: the op writes
the new rows in place and reads the prefix where it lies (no per-step copy of the cache). The LM head is
`Gemm(x, W[V, H], transB=1)` on the embedding itself when tied, a MatMul on W^T when not, like the portable graph.

Weights go tensor by tensor into an external-data file through `WeightFile`, which reuses any tensor
the portable graph already stores byte for byte (in `target.onnx.data`, or the embedding in the bundle's
`shared.onnx.data`): the two flavours share one copy of the weights.

>>> build_fused_target(target, capture=(1, 4), out=Path("b/target_fused.onnx"),
...                    data=Path("b/target.onnx.data"))                    # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from dflash_edge.runtime.io_tables import GRAPHS, expand_specs

from .external_data import INLINE_BELOW, append_aligned

MS = "com.microsoft"
OPSET_FUSED = 23              # RMSNormalization is standard from opset 23 (onnxruntime runs it as its fused kernel)
_ONNX_DTYPES = {"int64": 7, "int32": 6, "float32": 1, "float16": 10}   # TensorProto enums


class WeightFile:
    """An external-data file that stores each distinct tensor once (tensors an indexed graph stores are reused).

    >>> wf = WeightFile(Path("b/target.onnx.data"), index_model=Path("b/target.onnx"))   # doctest: +SKIP
    >>> init = wf.tensor("w", np.ones((512, 64), np.float32))                          # doctest: +SKIP
    """

    def __init__(self, path: Path, index_model: Path | None = None):
        self.path = Path(path)
        self.offsets: dict[bytes, tuple[str, int, int]] = {}    # sha256 of the bytes -> (file, offset, length)
        self.placed: dict[str, tuple[str, int]] = {}           # initializer name -> (file, offset)
        self.reused_bytes = self.appended_bytes = 0
        if index_model is not None:
            self._index(index_model)

    def _index(self, model_path: Path) -> None:
        """Hash every external tensor of `model_path`, whichever of the bundle's files it lives in."""
        import onnx

        model = onnx.load(str(model_path), load_external_data=False)
        for init in model.graph.initializer:
            info = {e.key: e.value for e in init.external_data}
            if init.data_location != onnx.TensorProto.EXTERNAL:
                continue
            offset, length = int(info.get("offset", 0)), int(info["length"])
            with open(Path(model_path).parent / info["location"], "rb") as f:
                f.seek(offset)
                key = hashlib.sha256(f.read(length)).digest()
            self.offsets.setdefault(key, (info["location"], offset, length))

    def tensor(self, name: str, array: np.ndarray):
        """A TensorProto for `array`: inline when small, else external (reused or appended)."""
        from onnx import TensorProto, numpy_helper

        array = np.ascontiguousarray(array)
        if array.nbytes < INLINE_BELOW:                         # as the portable export: inside the .onnx
            return numpy_helper.from_array(array, name)
        raw = array.tobytes()
        key = hashlib.sha256(raw).digest()
        if key in self.offsets:
            self.reused_bytes += len(raw)
        else:
            with open(self.path, "ab") as f:
                self.offsets[key] = (self.path.name, append_aligned(f, raw), len(raw))
            self.appended_bytes += len(raw)
        location, offset, length = self.offsets[key]
        self.placed[name] = (location, offset)
        proto = TensorProto(name=name, data_type=_ONNX_DTYPES[str(array.dtype)], dims=list(array.shape),
                            data_location=TensorProto.EXTERNAL)
        for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
            entry = proto.external_data.add()
            entry.key, entry.value = k, v
        return proto


class _Builder:
    """Nodes + initializers of one graph; every helper returns its output name."""

    def __init__(self, weights: WeightFile):
        self.weights, self.nodes, self.inits, self._n = weights, [], [], 0

    def op(self, op_type: str, inputs: list[str], outs: int | list[str] = 1, domain: str = "", **attrs) -> list[str]:
        """Append a node; `outs`: how many outputs to name automatically, or their names. `attrs`: ONNX attributes."""
        from onnx import helper

        self._n += 1
        if isinstance(outs, int):
            outs = [f"{op_type}_{self._n}_{k}" for k in range(outs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"{op_type}_{self._n}", domain=domain, **attrs))
        return outs

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(self.weights.tensor(name, array))
        return name

    def const(self, name: str, values) -> str:
        return self.init(name, np.asarray(values, np.int64))

    def linear(self, x: str, module, name: str) -> str:
        """x @ W^T (+ b): MatMul on the transposed weight, as the portable export stores it."""
        w = module.weight.detach().float().numpy()
        y = self.op("MatMul", [x, self.init(f"{name}.weight.T", w.T)])[0]         # [1, T, out]
        if module.bias is not None:
            y = self.op("Add", [y, self.init(f"{name}.bias", module.bias.detach().float().numpy())])[0]
        return y

    def norm_weight(self, name: str, norm) -> str:
        return self.init(f"{name}.weight", norm.weight.detach().float().numpy())


def _head_norm(g: _Builder, x: str, norm, name: str, heads: int, head_dim: int, eps: float) -> str:
    """Per-head RMSNorm (qwen3's q_norm / k_norm) on [1, T, heads * D]."""
    split = g.op("Reshape", [x, g.const(f"{name}.shape_heads", [0, 0, heads, head_dim])])[0]   # [1, T, h, D]
    normed = g.op("RMSNormalization", [split, g.norm_weight(name, norm)], axis=-1, epsilon=eps)[0]
    return g.op("Reshape", [normed, g.const(f"{name}.shape_flat", [0, 0, heads * head_dim])])[0]  # [1, T, h*D]


def _skip_norm(g: _Builder, y: str, x: str, name: str, norm, eps: float) -> tuple[str, str]:
    """(RMSNorm(x + y), x + y) in one op: the residual add fused into the next norm."""
    normed, _, _, total = g.op("SkipSimplifiedLayerNormalization", [y, x, g.norm_weight(name, norm)],
                               [f"{name}.out", "", "", f"{name}.residual"], domain=MS, epsilon=eps)   # no mean/inv-std
    return normed, total


def _packed_qkv(g: _Builder, h: str, attn, name: str) -> str:
    """q, k and v projections as one MatMul on the concatenated weight: [1, T, (Hq + 2 Hkv) * D]."""
    mods = (attn.q_proj, attn.k_proj, attn.v_proj)
    w = np.concatenate([m.weight.detach().float().numpy() for m in mods])          # [(Hq + 2Hkv) D, H]
    y = g.op("MatMul", [h, g.init(f"{name}.qkv_proj.weight.T", w.T)])[0]            # [1, T, (Hq + 2Hkv) D]
    if attn.q_proj.bias is not None:
        bias = np.concatenate([m.bias.detach().float().numpy() for m in mods])
        y = g.op("Add", [y, g.init(f"{name}.qkv_proj.bias", bias)])[0]
    return y


def _attention(g: _Builder, h: str, layer, i: int, io: dict) -> str:
    """One layer's attention on normed input `h` [1, T, H] -> o_proj output [1, T, H].

    GroupQueryAttention gets one zero row after the T real ones (its output row is dropped): with T = 1 its
    probs x V product would otherwise take onnxruntime's single-row sgemm kernel, whose sums differ in the
    last bits from the multi-row kernel of a T = k verify step; quantised MatMuls amplify that into
    different tokens (measured: docs/BENCHMARKS.md). With >= 2 rows every step takes the same kernel and a
    decode row equals the same row of a verify step bit for bit. The extra row's K/V land one slot past
    the live ones and are overwritten by the next step (the runtime keeps that slot free).
    """
    attn, s = layer.self_attn, layer.self_attn.s
    name = f"model.layers.{i}.self_attn"
    qkv = _packed_qkv(g, h, attn, name)                                               # [1, T, (Hq + 2Hkv) D]
    width = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    if s.qk_norm:                                                                    # per-head norms before rotary
        sizes = g.const(f"{name}.qkv_sizes", [s.num_heads * s.head_dim, *[s.num_kv_heads * s.head_dim] * 2])
        q, k, v = g.op("Split", [qkv, sizes], 3, axis=-1)
        q = _head_norm(g, q, attn.q_norm, f"{name}.q_norm", s.num_heads, s.head_dim, s.rms_norm_eps)
        k = _head_norm(g, k, attn.k_norm, f"{name}.k_norm", s.num_kv_heads, s.head_dim, s.rms_norm_eps)
        qkv = g.op("Concat", [q, k, v], axis=-1)[0]
    pad = f"pad_row_{width}"
    if pad not in io:                                                                # one constant for all layers
        io[pad] = g.init(pad, np.zeros((1, 1, width), np.float32))
    padded = g.op("Concat", [qkv, pad], axis=1)[0]                                   # [1, T + 1, (Hq + 2Hkv) D]
    out = g.op("GroupQueryAttention",                                                # present = past's buffer
               [padded, "", "", f"past_key.{i}", f"past_value.{i}", io["seqlens"], io["total"], io["cos"], io["sin"]],
               [f"{name}.out_padded", f"present_key.{i}", f"present_value.{i}"], domain=MS,
               num_heads=s.num_heads, kv_num_heads=s.num_kv_heads, do_rotary=1, rotary_interleaved=0)[0]
    real = g.op("Slice", [out, io["zero"], io["minus_one"], io["one"]])[0]           # [1, T, Hq D]: pad row dropped
    return g.linear(real, attn.o_proj, f"{name}.o_proj")                              # [1, T, H]


def _mlp(g: _Builder, h: str, mlp, name: str) -> str:
    gate = g.linear(h, mlp.gate_proj, f"{name}.gate_proj")                           # [1, T, I]
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])[0]])[0]
    return g.linear(g.op("Mul", [silu, g.linear(h, mlp.up_proj, f"{name}.up_proj")])[0], mlp.down_proj,
                    f"{name}.down_proj")                                             # [1, T, H]


def build_fused_target(target, capture: tuple[int, ...], out: Path, data: Path,
                       index_model: Path | None = None, shared=None) -> dict:
    """Write `out` (the `target_fused` graph) with its weights in `data`; returns {reused, appended} bytes.

    `index_model`: a graph whose tensors are already written (the portable target): identical tensors are
    referenced, not written again. `shared` (export/external_data.SharedData): the fused graph's names of
    the tensors it reuses from the shared file are added there, so the runtime loads them once.
    """
    import onnx
    from onnx import helper

    cfg, body = target.config, target.model
    eps, half = cfg.rms_norm_eps, cfg.head_dim // 2
    weights = WeightFile(data, index_model)
    g = _Builder(weights)
    embed = g.init("model.embed_tokens.weight", body.embed_tokens.weight.detach().float().numpy())
    io = {"cos": g.init("rope.cos_cache", target.rope.cos[:, :half].numpy()),         # [P, D/2]: cos/sin scale
          "sin": g.init("rope.sin_cache", target.rope.sin[:, :half].numpy())}        # (yarn) already folded in
    io["zero"], io["minus_one"], io["one"] = g.const("zero", [0]), g.const("minus_one", [-1]), g.const("one", [1])
    one32 = g.init("one_int32", np.ones((), np.int32))
    io["seqlens"] = g.op("Add", ["seqlens_k", one32])[0]                           # lengths with the pad row
    io["total"] = g.op("Add", ["total_sequence_length", one32])[0]
    x = g.op("Gather", [embed, "input_ids"])[0]                                      # [1, T, H]
    first_norm = g.norm_weight("model.layers.0.input_layernorm", body.layers[0].input_layernorm)
    h = g.op("RMSNormalization", [x, first_norm], axis=-1, epsilon=eps)[0]
    captured = {}
    for i, layer in enumerate(body.layers):
        a = _attention(g, h, layer, i, io)
        h, x = _skip_norm(g, a, x, f"model.layers.{i}.post_attention_layernorm", layer.post_attention_layernorm, eps)
        m = _mlp(g, h, layer.mlp, f"model.layers.{i}.mlp")
        last = i + 1 == len(body.layers)
        nxt = body.norm if last else body.layers[i + 1].input_layernorm
        h, x = _skip_norm(g, m, x, "model.norm" if last else f"model.layers.{i + 1}.input_layernorm", nxt, eps)
        if i in capture:
            captured[i] = x
    g.op("Concat", [captured[i] for i in capture], ["hidden"], axis=-1)              # [1, T, N]
    if cfg.tie_word_embeddings:                    # Gemm on the embedding itself (quantize/tied_embedding.py)
        flat = g.op("Reshape", [h, g.const("shape_rows", [-1, cfg.hidden_size])])[0]     # [T, H]
        logits = g.op("Gemm", [flat, embed], transB=1)[0]                                # [T, V]
        g.op("Reshape", [logits, g.const("shape_logits", [1, -1, cfg.vocab_size])], ["logits"])   # [1, T, V]
    else:                                          # MatMul on W^T, as the portable graph stores an untied head
        w = target.lm_head.weight.detach().float().numpy()                               # [V, H]
        g.op("MatMul", [h, g.init("lm_head.weight.T", w.T)], ["logits"])                # [1, T, V]
    g.op("ArgMax", ["logits"], ["next_ids"], axis=-1, keepdims=0)                    # [1, T]

    dims = {"L": cfg.num_hidden_layers, "Hkv": cfg.num_key_value_heads, "D": cfg.head_dim, "V": cfg.vocab_size,
            "H": cfg.hidden_size, "N": len(capture) * cfg.hidden_size}
    spec = GRAPHS["target_fused"]

    def value_info(side):   # fixed symbols resolved, dynamic ones (T, Smax) left as named dims
        return [helper.make_tensor_value_info(t.name, _ONNX_DTYPES["float32" if t.dtype == "kv" else t.dtype],
                                              [int(d) if d.isdigit() else dims.get(d, d) for d in t.shape])
                for t in expand_specs(spec[side], dims)]

    graph = helper.make_graph(g.nodes, "target_fused", value_info("inputs"), value_info("outputs"), g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET_FUSED), helper.make_opsetid(MS, 1)],
                              producer_name="dflash-edge")
    onnx.save_model(model, str(out))
    if shared is not None:
        shared.adopt("target_fused", weights.placed)
    return {"reused_bytes": weights.reused_bytes, "appended_bytes": weights.appended_bytes}

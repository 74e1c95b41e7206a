"""The decoder blocks of the portable graphs (standard ONNX ops, opset 17: what TensorRT parses),
written node by node. Each block mirrors its torch reference in `models/layers.py` op for op
(RMSNorm as Pow/ReduceMean/Sqrt/Div, rotate-half RoPE, GQA as grouped MatMuls, SwiGLU), so
onnxruntime fuses them the same way (SimplifiedLayerNormalization, FusedMatMul, QuickGelu) and
parity holds to float rounding.

Weights are read one tensor at a time from a checkpoint (`models/checkpoint.Checkpoint.array`) by
their Hugging Face names under a prefix (`model.layers.3` for a target, `layers.3` for a z-lab
drafter); what differs per family comes from its `AttentionSpec` (biases, per-head q/k norm), never
from the file name.

>>> layer = Layer(ckpt, "model.layers.0", spec, intermediate)  # doctest: +SKIP
>>> x = decoder_layer(g, x, layer, Keys(rope, past, mask))  # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..models.rope import rope_tables
from ..models.spec import AttentionSpec
from .graph_builder import GraphBuilder
from .weight_format import Weight, matmul


@dataclass(frozen=True)
class Layer:
    """Where one decoder layer's weights are (checkpoint + name prefix) and what its attention looks
    like."""

    ckpt: object
    prefix: str
    spec: AttentionSpec
    write_mlp: object = None  # its family's MLP writer (target_job.MlpWriters); None: `mlp`


@dataclass(frozen=True)
class Rope:
    """cos / sin rows [T, D] for the queries and for the keys (the drafter's keys also cover its
    context)."""

    cos_q: str
    sin_q: str
    cos_kv: str
    sin_kv: str


@dataclass(frozen=True)
class Keys:
    """What one layer's queries attend over: the RoPE rows, the past K / V [1, Hkv, S, D] and the
    additive mask [rep*T, S + Tkv] (None: every key visible)."""

    rope: Rope
    past: tuple[str, str]
    mask: str | None


def linear(g: GraphBuilder, x: str, ckpt, name: str, bias: bool) -> str:
    """x @ W^T (+ b), W = `name.weight`: [.., in] -> [.., out], W at the graph's precision
    (weight_format.py)."""
    y = matmul(g, x, Weight.named(ckpt, f"{name}.weight"))
    if bias:
        y = g.op("Add", [y, g.init(f"{name}.bias", lambda: ckpt.array(f"{name}.bias"))])
    return y


def rms_norm(g: GraphBuilder, x: str, ckpt, name: str, eps: float) -> str:
    """weight * x / sqrt(mean(x^2) + eps) over the last axis, as models/layers.RMSNorm is
    exported."""
    mean = g.op("ReduceMean", [g.op("Pow", [x, g.scalar(2.0)])], axes=[-1], keepdims=1)
    inv = g.op("Div", [g.scalar(1.0), g.op("Sqrt", [g.op("Add", [mean, g.scalar(eps)])])])
    normed = g.op("Mul", [x, inv])
    return g.op("Mul", [g.init(f"{name}.weight", lambda: ckpt.array(f"{name}.weight")), normed])


def apply_rope(
    g: GraphBuilder, x: str, cos: str, sin: str, head_dim: int, rotary: int | None = None
) -> str:
    """x * cos + rotate_half(x) * sin on [1, heads, T, D] with cos/sin [T, R]: the first R =
    `rotary` dims rotate (default all), the rest pass through (Qwen3.5's partial rotary)."""
    rot, axis = rotary or head_dim, g.const([-1])
    # [1, h, T, R]
    turning = x if rot == head_dim else g.op("Slice", [x, g.const([0]), g.const([rot]), axis])
    half = g.const([rot // 2])
    x2 = g.op("Slice", [turning, half, g.const([rot]), axis])  # [1, h, T, R/2]
    x1 = g.op("Slice", [turning, g.const([0]), half, axis])
    rotated = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)  # [1, h, T, R]
    y = g.op("Add", [g.op("Mul", [turning, cos]), g.op("Mul", [rotated, sin])])
    if rot == head_dim:
        return y
    return g.op(
        "Concat", [y, g.op("Slice", [x, g.const([rot]), g.const([head_dim]), axis])], axis=-1
    )


def packed_qkv(g: GraphBuilder, h: str, layer: Layer) -> str:
    """q, k and v projections of h [1, T, H] as one MatMul on the concatenated weight: [1, T, (Hq +
    2 Hkv) * D] (one initializer, `qkv_proj.weight`, that both target flavours read from
    target.onnx.data)."""
    name, ckpt = f"{layer.prefix}.self_attn", layer.ckpt
    projs = [f"{name}.{p}_proj" for p in "qkv"]
    # [1, T, (Hq + 2Hkv) D]
    y = matmul(g, h, Weight(ckpt, [f"{p}.weight" for p in projs], f"{name}.qkv_proj.weight"))
    if layer.spec.qkv_bias:
        bias = lambda: np.concatenate([ckpt.array(f"{p}.bias") for p in projs])  # noqa: E731
        y = g.op("Add", [y, g.init(f"{name}.qkv_proj.bias", bias)])
    return y


def projections(g: GraphBuilder, h: str, kv_in: str, layer: Layer) -> list[str]:
    """[q, k, v] [1, T, n*D]: queries from h, keys and values from kv_in; one packed MatMul when
    both are the same input (a target's self-attention), else three (the drafter's queries see only
    the block)."""
    s = layer.spec
    if h == kv_in:
        sizes = g.const([s.num_heads * s.head_dim] + [s.num_kv_heads * s.head_dim] * 2)
        return g.ops("Split", [packed_qkv(g, h, layer), sizes], 3, axis=-1)
    name = f"{layer.prefix}.self_attn"
    return [
        linear(g, x, layer.ckpt, f"{name}.{p}_proj", s.qkv_bias)
        for x, p in ((h, "q"), (kv_in, "k"), (kv_in, "v"))
    ]


def heads(g: GraphBuilder, y: str, layer: Layer, num: int, norm: str | None) -> str:
    """A projection y [1, T, num * D] split into heads [1, num, T, D] (per-head RMSNorm `norm` if
    the family has it)."""
    s = layer.spec
    t = g.op("Reshape", [y, g.const([0, 0, num, s.head_dim])])  # [1, T, n, D]
    if norm and s.qk_norm:
        t = rms_norm(g, t, layer.ckpt, f"{layer.prefix}.self_attn.{norm}", s.rms_norm_eps)
    return g.op("Transpose", [t], perm=[0, 2, 1, 3])  # [1, n, T, D]


def attention(
    g: GraphBuilder, h: str, kv_in: str, layer: Layer, keys: Keys
) -> tuple[str, str, str]:
    """Queries from h [1, T, H], new keys/values from kv_in [1, Tkv, H], attending to [past ; new]
    (`keys`).

    Returns (o_proj output [1, T, H], new K [1, Hkv, Tkv, D], new V)."""
    s, rope = layer.spec, keys.rope
    q, k, v = projections(g, h, kv_in, layer)
    q = apply_rope(g, heads(g, q, layer, s.num_heads, "q_norm"), rope.cos_q, rope.sin_q, s.head_dim)
    # [1, Hkv, Tkv, D]
    k_new = apply_rope(
        g, heads(g, k, layer, s.num_kv_heads, "k_norm"), rope.cos_kv, rope.sin_kv, s.head_dim
    )
    v_new = heads(g, v, layer, s.num_kv_heads, None)
    # [1, T, Hq*D]
    out = g.op(
        "Reshape",
        [attend(g, q, (k_new, v_new), keys, s), g.const([0, 0, s.num_heads * s.head_dim])],
    )
    return linear(g, out, layer.ckpt, f"{layer.prefix}.self_attn.o_proj", s.o_bias), k_new, v_new


def attend(g: GraphBuilder, q: str, new: tuple[str, str], keys: Keys, spec: AttentionSpec) -> str:
    """Scaled dot-product attention of q [1, Hq, T, D] over [past ; new] keys and values [1, Hkv, S
    + Tkv, D] (query heads grouped per KV head) -> [1, T, Hq, D]; `keys.mask`: additive [rep*T, S +
    Tkv], or None."""
    num_heads, num_kv_heads, head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
    k = g.op("Concat", [keys.past[0], new[0]], axis=2)  # [1, Hkv, S + Tkv, D]
    v = g.op("Concat", [keys.past[1], new[1]], axis=2)
    grouped = g.op("Reshape", [q, g.const([1, num_kv_heads, -1, head_dim])])  # [1, Hkv, rep*T, D]
    # [1, Hkv, rep*T, S']
    scores = g.op("MatMul", [grouped, g.op("Transpose", [k], perm=[0, 1, 3, 2])])
    scores = g.op("Div", [scores, g.scalar(math.sqrt(head_dim))])
    if keys.mask is not None:
        scores = g.op("Add", [scores, keys.mask])
    out = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])  # [1, Hkv, rep*T, D]
    out = g.op("Reshape", [out, g.const([1, num_heads, -1, head_dim])])  # [1, Hq, T, D]
    return g.op("Transpose", [out], perm=[0, 2, 1, 3])  # [1, T, Hq, D]


def mlp(g: GraphBuilder, h: str, layer: Layer) -> str:
    """down(silu(gate(h)) * up(h)); silu as x * Sigmoid(x) (onnxruntime fuses it): the dense MLP."""
    name = f"{layer.prefix}.mlp"
    # low-bit: gate and up as one MatMulNBits over stacked rows (one op and one correction
    # fewer), both flavours
    if g.fmt.bits:
        width = layer.ckpt.shape(f"{name}.gate_proj.weight")[0]
        gate_up = [f"{name}.{p}_proj.weight" for p in ("gate", "up")]
        # [1, T, 2I]
        both = matmul(g, h, Weight(layer.ckpt, gate_up, f"{name}.gate_up_proj.weight"))
        gate, up = g.ops("Split", [both, g.const([width, width])], 2, axis=-1)  # [1, T, I] each
    else:
        gate = linear(g, h, layer.ckpt, f"{name}.gate_proj", False)  # [1, T, I]
        up = linear(g, h, layer.ckpt, f"{name}.up_proj", False)
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
    return linear(g, g.op("Mul", [silu, up]), layer.ckpt, f"{name}.down_proj", False)  # [1, T, H]


def decoder_layer(
    g: GraphBuilder, x: str, layer: Layer, keys: Keys, ctx: str | None = None
) -> tuple[str, str, str]:
    """Pre-norm decoder layer (models/layers.DecoderLayer): (x out [1, T, H], new K, new V).

    `ctx` (drafter only): context features [1, C, H] placed before the layer's own key/value input.
    """
    eps = layer.spec.rms_norm_eps
    h = rms_norm(g, x, layer.ckpt, f"{layer.prefix}.input_layernorm", eps)
    kv_in = h if ctx is None else g.op("Concat", [ctx, h], axis=1)  # [1, C + T, H]
    attn, k_new, v_new = attention(g, h, kv_in, layer, keys)
    x = g.op("Add", [x, attn])
    write_mlp = layer.write_mlp or mlp  # the family's (export/families), else dense
    h = rms_norm(g, x, layer.ckpt, f"{layer.prefix}.post_attention_layernorm", eps)
    m = write_mlp(g, h, layer)
    return g.op("Add", [x, m]), k_new, v_new


def split_past(g: GraphBuilder, past: str, num_layers: int) -> list[str]:
    """[S, L, Hkv, D] -> L tensors [1, Hkv, S, D] (one Transpose, one Split)."""
    per_layer = g.op("Transpose", [past], perm=[1, 2, 0, 3])  # [L, Hkv, S, D]
    if num_layers == 1:
        return [per_layer]
    return g.ops("Split", [per_layer, g.const([1] * num_layers)], num_layers, axis=0)


def stack_new(g: GraphBuilder, new: list[str], out: str) -> str:
    """L tensors [1, Hkv, T, D] -> `out` [T, L, Hkv, D]."""
    stacked = new[0] if len(new) == 1 else g.op("Concat", new, axis=0)  # [L, Hkv, T, D]
    return g.op("Transpose", [stacked], out, perm=[2, 0, 1, 3])


def rope_rows(g: GraphBuilder, table: tuple[str, str], positions: str) -> tuple[str, str]:
    """cos / sin rows [T, D] of the tables [P, D] at `positions` [T]."""
    return g.op("Gather", [table[0], positions], axis=0), g.op(
        "Gather", [table[1], positions], axis=0
    )


def rope_at(g: GraphBuilder, table: tuple[str, str], positions: str) -> Rope:
    """The RoPE rows at `positions` [T] for queries and keys alike (a target's self-attention)."""
    cos, sin = rope_rows(g, table, positions)  # [T, D] each
    return Rope(cos, sin, cos, sin)


def rope_table(
    g: GraphBuilder, name: str, cfg, dim: int | None = None, rows: int | None = None
) -> tuple[str, str]:
    """The config's RoPE tables as initializers [P, dim] (models/rope.py: the torch reference's
    own); `dim`: the rotated width when only part of each head rotates (default: the whole head);
    `rows`: the positions the bundle can reach (ExportOptions.positions; default the model's
    max_position_embeddings)."""

    tables = {}

    def make(which):
        if not tables:
            tables["cos"], tables["sin"] = rope_tables(
                dim or cfg.head_dim,
                cfg.rope_theta,
                cfg.rope_scaling,
                cfg.max_position_embeddings,
                rows,
            )
        return tables.pop(which)

    return g.init(f"{name}.cos", lambda: make("cos")), g.init(f"{name}.sin", lambda: make("sin"))


def int_range(g: GraphBuilder, length: str) -> str:
    """0 .. length-1 (int64) for a 1-element length tensor [1]."""
    n = g.op("Squeeze", [length, g.const([0])])  # scalar
    return g.op("Range", [g.const(0), n, g.const(1)])


def float_min() -> float:
    return float(np.finfo(np.float32).min)

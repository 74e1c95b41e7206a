"""The portable `target_hybrid` graph of a Qwen3.5 (hybrid linear-attention) target, written node by
node from its checkpoint in standard ONNX ops (opset 17). The exporter writes it instead of `target`
/ `target_fused` for a hybrid family (families/qwen3_5.py); the runtime runs it as
`HybridTargetModel` (runtime/targets.py; I/O: `io_tables.GRAPHS["target_hybrid"]`).

Its torch reference is `models/linear_attention.HybridModel.step`: full-attention layers read and
return K/V like the dense target; the Gated DeltaNet layers run the delta rule in the chunk-parallel
form of models/linear_attention.py's docstring for the call's T tokens at once. The unit-lower
triangular system (I + A) U = R, which has no ONNX op, is solved exactly by the product (I + A)^-1 =
(I - A)(I + A^2)(I + A^4)... (A is strictly lower, so A^T = 0: ceil(log2 T) factors suffice for T <=
MAX_TOKENS).

Speculative rollback without storing a state per token: a call returns the states it *started* from
and, per token, the rows the unrolled rule needs (conv input, k, u, cumulative log decay; ~1/250 of
a recurrent state at Qwen3.5-4B's dims). The next call gets those and `kept` (how many of its tokens
were accepted) and first rebuilds the states after exactly those tokens (`_commit`: a slice of the
conv rows and one rank-`kept` update of the recurrent state), so a partial accept costs what a full
one does and nothing is re-run.

>>> build_hybrid_target(  # doctest: +SKIP
...     cfg, ckpt, capture=(1,), store=store, out=Path("b/target_hybrid.onnx"))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..models.families.qwen3_5 import LINEAR, attention_spec
from ..runtime.errors import DflashEdgeError
from .dq_table import embedding_table
from .graph_builder import OPSET, GraphBuilder
from .portable_layers import (
    Layer,
    apply_rope,
    attend,
    float_min,
    int_range,
    linear,
    mlp,
    rope_rows,
    rope_table,
    split_past,
    stack_new,
)
from .portable_target import causal_mask, untied_head

GRAPH = "target_hybrid"
MAX_TOKENS = 64  # the most tokens one call may carry (the solve's factor count follows from it)


def centred_norm(g: GraphBuilder, x: str, ckpt, name: str, eps: float) -> str:
    """x / rms(x) * (1 + w) over the last axis (the zero-centred weight is stored as 1 + w)."""
    mean = g.op("ReduceMean", [g.op("Mul", [x, x])], axes=[-1], keepdims=1)
    normed = g.op("Div", [x, g.op("Sqrt", [g.op("Add", [mean, g.scalar(eps)])])])
    return g.op(
        "Mul", [normed, g.init(f"{name}.weight+1", lambda: 1.0 + ckpt.array(f"{name}.weight"))]
    )


def _silu(g: GraphBuilder, x: str) -> str:
    return g.op("Mul", [x, g.op("Sigmoid", [x])])


def _heads(g: GraphBuilder, x: str, num: int, dim: int) -> str:
    """[T, num*dim] -> [num, T, dim]."""
    return g.op("Transpose", [g.op("Reshape", [x, g.const([-1, num, dim])])], perm=[1, 0, 2])


def _unit_lower_inverse(g: GraphBuilder, a: str, eye: str) -> str:
    """(I + A)^-1 for strictly lower A [h, T, T] (T <= MAX_TOKENS): (I - A)(I + A^2)(I + A^4)..."""
    inverse, power = g.op("Sub", [eye, a]), a
    for _ in range(math.ceil(math.log2(MAX_TOKENS)) - 1):
        power = g.op("MatMul", [power, power])
        inverse = g.op("MatMul", [inverse, g.op("Add", [eye, power])])
    return inverse


@dataclass(frozen=True)
class Carried:
    """What one linear layer carries from the previous call (io_tables `target_hybrid`): the conv /
    recurrent state at its start (`conv_base` [Cv, K-1], `rec_base` [Hv, Dk, Dv]) and its per-token
    rows (`qkv` [Tp, Cv], `k` [Tp, Hv, Dk], `u` [Tp, Hv, Dv], `decay` [Tp, Hv]: cumulative log decay
    G), of which `kept` [1] were accepted."""

    conv_base: str
    rec_base: str
    qkv: str
    k: str
    u: str
    decay: str
    kept: str
    valid: str  # [Tp] bool: row s < kept


def _commit(g: GraphBuilder, c: Carried, hv: int, km1: int) -> tuple[str, str]:
    """The states after the previous call's `kept` tokens (models/linear_attention.py's unrolled
    rule): conv = the K-1 inputs before token `kept`, S = e^{G_a} S_base + sum_{s<kept} e^{G_a -
    G_s} k_s u_s^T."""
    # [Cv, K-1+Tp]
    seq = g.op("Concat", [c.conv_base, g.op("Transpose", [c.qkv], perm=[1, 0])], axis=1)
    # [Cv, K-1]
    conv = g.op("Slice", [seq, c.kept, g.op("Add", [c.kept, g.const([km1])]), g.const([1])])
    decay = g.op("Transpose", [c.decay], perm=[1, 0])  # [Hv, Tp]
    # [Hv, 1+Tp]: G_0 = 0
    padded = g.op("Concat", [g.const(np.zeros((hv, 1)), np.float32), decay], axis=1)
    last = g.op("Gather", [padded, c.kept], axis=1)  # [Hv, 1]: G_a
    weight = g.op(
        "Exp", [g.op("Where", [c.valid, g.op("Sub", [last, decay]), g.scalar(float_min())])]
    )
    # [Hv, Dk, Tp]
    keys = g.op(
        "Mul",
        [g.op("Transpose", [c.k], perm=[1, 2, 0]), g.op("Unsqueeze", [weight, g.const([1])])],
    )
    update = g.op("MatMul", [keys, g.op("Transpose", [c.u], perm=[1, 0, 2])])  # [Hv, Dk, Dv]
    grow = g.op("Exp", [g.op("Unsqueeze", [last, g.const([2])])])  # [Hv, 1, 1]
    return conv, g.op("Add", [g.op("Mul", [grow, c.rec_base]), update])


def gated_deltanet(g: GraphBuilder, h: str, cfg, ckpt, name: str, carried: Carried, tri):
    """One linear layer: h [T, H] after the previous call (`carried`) -> (out [T, H], (conv state
    [Cv, K-1], recurrent state [Hv, Dk, Dv]) at this call's start, and this call's rows for the next
    one: qkv [T, Cv], k [T, Hv, Dk], u [T, Hv, Dv], decay [T, Hv]). `tri`: (lower incl. diagonal,
    strictly lower, identity) [T, T]."""
    lower, strict, eye = tri
    hk, hv, dk, dv = (
        cfg.linear_num_key_heads,
        cfg.linear_num_value_heads,
        cfg.linear_key_head_dim,
        cfg.linear_value_head_dim,
    )
    conv_state, rec_state = _commit(g, carried, hv, cfg.linear_conv_kernel_dim - 1)
    qkv = linear(g, h, ckpt, f"{name}.in_proj_qkv", False)  # [T, Cv]
    seq = g.op("Concat", [conv_state, g.op("Transpose", [qkv], perm=[1, 0])], axis=1)  # [Cv, K-1+T]
    # [1, Cv, T]
    conv = g.op(
        "Conv",
        [
            g.op("Unsqueeze", [seq, g.const([0])]),
            g.init(f"{name}.conv1d.weight", lambda: ckpt.array(f"{name}.conv1d.weight")),
        ],
        group=cfg.conv_dim,
    )
    # [T, Cv]
    mixed = g.op("Transpose", [_silu(g, g.op("Squeeze", [conv, g.const([0])]))], perm=[1, 0])
    kd = hk * dk
    q, k, v = g.ops("Split", [mixed, g.const([kd, kd, hv * dv])], 3, axis=1)

    def keyed(t: str) -> str:  # [T, Hk*Dk] -> L2-normalised, one copy per value head [Hv, T, Dk]
        t = g.op("Reshape", [t, g.const([-1, hk, 1, dk])])  # [T, Hk, 1, Dk]
        t = g.op(
            "Div",
            [
                t,
                g.op(
                    "Sqrt",
                    [
                        g.op(
                            "Add",
                            [
                                g.op("ReduceSum", [g.op("Mul", [t, t]), g.const([-1])], keepdims=1),
                                g.scalar(1e-6),
                            ],
                        )
                    ],
                ),
            ],
        )
        t = g.op("Expand", [t, g.const([1, hk, hv // hk, dk])])  # [T, Hk, G, Dk]
        return g.op("Transpose", [g.op("Reshape", [t, g.const([-1, hv, dk])])], perm=[1, 0, 2])

    q = g.op("Mul", [keyed(q), g.scalar(1 / math.sqrt(dk))])  # [Hv, T, Dk]
    k, v = keyed(k), _heads(g, v, hv, dv)  # [Hv, T, Dv]
    # [Hv, T]
    beta = g.op(
        "Transpose",
        [g.op("Sigmoid", [linear(g, h, ckpt, f"{name}.in_proj_b", False)])],
        perm=[1, 0],
    )
    dt = g.op(
        "Add",
        [
            linear(g, h, ckpt, f"{name}.in_proj_a", False),
            g.init(f"{name}.dt_bias", lambda: ckpt.array(f"{name}.dt_bias")),
        ],
    )
    decay = g.op(
        "Mul",
        [
            g.op("Softplus", [dt]),
            g.init(f"{name}.-exp(A_log)", lambda: -np.exp(ckpt.array(f"{name}.A_log"))),
        ],
    )
    cum = g.op("CumSum", [g.op("Transpose", [decay], perm=[1, 0]), g.const(1)])  # [Hv, T]: G_t
    diff = g.op(
        "Sub",
        [g.op("Unsqueeze", [cum, g.const([2])]), g.op("Unsqueeze", [cum, g.const([1])])],
    )
    # [Hv, T, T]: e^{G_t-G_s}
    gap = g.op("Exp", [g.op("Where", [lower, diff, g.scalar(float_min())])])
    grow = g.op("Unsqueeze", [g.op("Exp", [cum]), g.const([2])])  # [Hv, T, 1]: e^{G_t}
    beta3 = g.op("Unsqueeze", [beta, g.const([2])])  # [Hv, T, 1]
    k_t = g.op("Transpose", [k], perm=[0, 2, 1])  # [Hv, Dk, T]
    # [Hv, T, T]
    a = g.op("Mul", [g.op("Mul", [beta3, g.op("MatMul", [k, k_t])]), g.op("Mul", [gap, strict])])
    read = g.op("MatMul", [k, rec_state])  # [Hv, T, Dv]: k^T S0
    rhs = g.op("Mul", [beta3, g.op("Sub", [v, g.op("Mul", [grow, read])])])
    u = g.op("MatMul", [_unit_lower_inverse(g, a, eye), rhs])  # [Hv, T, Dv]
    seen = g.op("Mul", [g.op("MatMul", [q, k_t]), gap])  # [Hv, T, T]
    o = g.op(
        "Add",
        [g.op("Mul", [grow, g.op("MatMul", [q, rec_state])]), g.op("MatMul", [seen, u])],
    )
    o = g.op("Transpose", [o], perm=[1, 0, 2])  # [T, Hv, Dv]
    mean = g.op("ReduceMean", [g.op("Mul", [o, o])], axes=[-1], keepdims=1)
    o = g.op("Div", [o, g.op("Sqrt", [g.op("Add", [mean, g.scalar(cfg.rms_norm_eps)])])])
    o = g.op("Mul", [o, g.init(f"{name}.norm.weight", lambda: ckpt.array(f"{name}.norm.weight"))])
    # [T, Hv, Dv]
    z = g.op("Reshape", [linear(g, h, ckpt, f"{name}.in_proj_z", False), g.const([-1, hv, dv])])
    o = g.op("Reshape", [g.op("Mul", [o, _silu(g, z)]), g.const([-1, hv * dv])])  # [T, Hv*Dv]
    # [T, ...] each
    rows = (
        qkv,
        g.op("Transpose", [k], perm=[1, 0, 2]),
        g.op("Transpose", [u], perm=[1, 0, 2]),
        g.op("Transpose", [cum], perm=[1, 0]),
    )
    return linear(g, o, ckpt, f"{name}.out_proj", False), (conv_state, rec_state), rows


def gated_attention(g: GraphBuilder, h: str, cfg, ckpt, name: str, rope, past, mask: str):
    """One full layer: h [T, H] after past (K, V [1, Hkv, S, D]) -> (out [T, H], new K, new V [1,
    Hkv, T, D])."""
    hq, hkv, d, rot = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rotary_dim
    bias = cfg.attention_bias
    # [T, Hq, 2D]
    qg = g.op("Reshape", [linear(g, h, ckpt, f"{name}.q_proj", bias), g.const([-1, hq, 2 * d])])
    q, gate = g.ops("Split", [qg, g.const([d, d])], 2, axis=2)

    def place(t: str, norm: str | None) -> str:  # [T, n, D] -> normed, [1, n, T, D], rotated
        t = centred_norm(g, t, ckpt, f"{name}.{norm}", cfg.rms_norm_eps) if norm else t
        return g.op("Unsqueeze", [g.op("Transpose", [t], perm=[1, 0, 2]), g.const([0])])

    q = apply_rope(g, place(q, "q_norm"), rope[0], rope[1], d, rot)
    k = apply_rope(
        g,
        place(
            g.op("Reshape", [linear(g, h, ckpt, f"{name}.k_proj", bias), g.const([-1, hkv, d])]),
            "k_norm",
        ),
        rope[0],
        rope[1],
        d,
        rot,
    )
    v = place(
        g.op("Reshape", [linear(g, h, ckpt, f"{name}.v_proj", bias), g.const([-1, hkv, d])]),
        None,
    )
    # [T, Hq*D]
    out = g.op("Reshape", [attend(g, q, k, v, past, mask, hq, hkv, d), g.const([-1, hq * d])])
    out = g.op("Mul", [out, g.op("Sigmoid", [g.op("Reshape", [gate, g.const([-1, hq * d])])])])
    return linear(g, out, ckpt, f"{name}.o_proj", bias), k, v


def _masks(g: GraphBuilder, offsets: str) -> tuple[str, str, str]:
    """(lower incl. diagonal bool, strictly lower float, identity float) [T, T] over this call's
    tokens."""
    rows, cols = (
        g.op("Unsqueeze", [offsets, g.const([1])]),
        g.op("Unsqueeze", [offsets, g.const([0])]),
    )
    as_float = lambda b: g.op("Cast", [b], to=1)  # noqa: E731
    return (
        g.op("GreaterOrEqual", [rows, cols]),
        as_float(g.op("Greater", [rows, cols])),
        as_float(g.op("Equal", [rows, cols])),
    )


def _per_layer(g: GraphBuilder, name: str, count: int, axis: int) -> list[str]:
    """Input `name` split along `axis` into `count` per-layer tensors, that axis dropped."""
    parts = g.ops("Split", [name, g.const([1] * count)], count, axis=axis) if count > 1 else [name]
    return [g.op("Squeeze", [t, g.const([axis])]) for t in parts]


def _carried(g: GraphBuilder, count: int) -> list[Carried]:
    """Each linear layer's `Carried` from the graph inputs (layer axis 0 of the bases, 1 of the
    rows)."""
    kept = "kept"
    # [Tp]
    valid = g.op("Less", [int_range(g, g.op("Shape", ["prev_decay"], start=0, end=1)), kept])
    bases = [_per_layer(g, n, count, 0) for n in ("conv_base", "rec_base")]
    rows = [_per_layer(g, n, count, 1) for n in ("prev_qkv", "prev_k", "prev_u", "prev_decay")]
    return [Carried(*b, *r, kept, valid) for b, r in zip(zip(*bases), zip(*rows))]


def _stack(g: GraphBuilder, parts: list[str], out: str, axis: int) -> str:
    """Per-layer tensors stacked on a new `axis` as graph output `out`."""
    return g.op("Concat", [g.op("Unsqueeze", [t, g.const([axis])]) for t in parts], out, axis=axis)


def check_options(opts) -> None:
    """Export options this graph cannot honour, named (`opts`: export.exporter.ExportOptions)."""

    for flag, value in (("--prefill-chunk", opts.prefill_chunk), ("--block-size", opts.block_size)):
        if value > MAX_TOKENS:
            raise DflashEdgeError(
                f"{flag} {value}: a hybrid target's call carries at most {MAX_TOKENS} tokens "
                f"(export/hybrid_target.MAX_TOKENS); use {flag} <= {MAX_TOKENS}"
            )
    if opts.precision == "fp16":
        raise DflashEdgeError(
            "--precision fp16: the hybrid target is written in fp32, int8 or int4 (its float16 "
            "graph is not checked); pass one of those"
        )


def build_hybrid_target(
    cfg, ckpt, capture: tuple[int, ...], store, out: Path, opts=None, fmt=None, log=None
) -> Path:
    """Write the hybrid target graph to `out` (weights appended to `store` as they are read, in
    `fmt`: the projections and the embedding / head at the bundle's precision,
    export/weight_format.py)."""
    if opts is not None:
        check_options(opts)
    p = cfg.weight_prefix
    # its weights go to the target's data file (DATA_FILES)
    g = GraphBuilder(GRAPH, store, fmt, log)
    num_new = g.op("Shape", ["input_ids"], start=1, end=2)  # [1] = T
    num_past = g.op("Shape", ["past_key"], start=0, end=1)  # [1] = S
    offsets = int_range(g, num_new)  # [T]
    table = rope_table(g, "rope", cfg, cfg.rotary_dim, opts and opts.positions)
    rope = rope_rows(g, table, g.op("Add", ["start", offsets]))  # [T, R]
    mask = causal_mask(
        g, num_new, num_past, offsets, cfg.num_attention_heads // cfg.num_key_value_heads
    )
    tri = _masks(g, offsets)
    embed = embedding_table(g, ckpt, f"{p}.embed_tokens.weight")  # shared with the drafter
    x = embed.gather(g.op("Squeeze", ["input_ids", g.const([0])]))  # [T, H]
    linear_ids = cfg.linear_layers
    full_ids = [i for i in range(cfg.num_hidden_layers) if i not in linear_ids]
    past = dict(
        zip(
            full_ids,
            zip(
                split_past(g, "past_key", len(full_ids)), split_past(g, "past_value", len(full_ids))
            ),
        )
    )
    carried = dict(zip(linear_ids, _carried(g, len(linear_ids))))
    spec = attention_spec(cfg)
    new_k, new_v, starts, rows, captured = [], [], [], [], {}
    for i, kind in enumerate(cfg.layer_types):
        name = f"{p}.layers.{i}"
        h = centred_norm(g, x, ckpt, f"{name}.input_layernorm", cfg.rms_norm_eps)
        if kind == LINEAR:
            h, state, mine = gated_deltanet(g, h, cfg, ckpt, f"{name}.linear_attn", carried[i], tri)
            starts.append(state)
            rows.append(mine)
        else:
            h, k, v = gated_attention(g, h, cfg, ckpt, f"{name}.self_attn", rope, past[i], mask)
            new_k.append(k)
            new_v.append(v)
        x = g.op("Add", [x, h])
        m = mlp(
            g,
            centred_norm(g, x, ckpt, f"{name}.post_attention_layernorm", cfg.rms_norm_eps),
            Layer(ckpt, name, spec),
        )
        x = g.op("Add", [x, m])  # [T, H]
        if i in capture:
            captured[i] = x
    hidden = g.op("Concat", [captured[i] for i in capture], axis=-1)  # [T, N]
    g.op("Unsqueeze", [hidden, g.const([0])], "hidden")  # [1, T, N]
    normed = centred_norm(g, x, ckpt, f"{p}.norm", cfg.rms_norm_eps)
    head = embed.head(normed) if cfg.tie_word_embeddings else untied_head(g, normed, ckpt)  # [T, V]
    g.op("Unsqueeze", [head, g.const([0])], "logits")  # [1, T, V]
    g.op("ArgMax", ["logits"], "next_ids", axis=-1, keepdims=0)  # [1, T]
    stack_new(g, new_k, "new_key")  # [T, Lf, Hkv, D]
    stack_new(g, new_v, "new_value")
    for j, out_name in enumerate(("conv_start", "rec_start")):  # [Ll, ...]: this call's
        _stack(g, [s[j] for s in starts], out_name, 0)  # starting states
    for j, out_name in enumerate(("qkv", "delta_k", "delta_u", "decay")):  # [T, Ll, ...]: its rows
        _stack(g, [r[j] for r in rows], out_name, 1)
    dims = {
        "Lf": len(full_ids),
        "Ll": len(linear_ids),
        "Hkv": cfg.num_key_value_heads,
        "D": cfg.head_dim,
        "V": cfg.vocab_size,
        "H": cfg.hidden_size,
        "N": len(capture) * cfg.hidden_size,
        "Cv": cfg.conv_dim,
        "Km1": cfg.linear_conv_kernel_dim - 1,
        "Hv": cfg.linear_num_value_heads,
        "Dk": cfg.linear_key_head_dim,
        "Dv": cfg.linear_value_head_dim,
    }
    return g.save(out, dims, {"": OPSET})

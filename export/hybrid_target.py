"""The portable `target_hybrid` graph of a Qwen3.5 (hybrid linear-attention) target, written node by
node from its checkpoint in standard ONNX ops (opset 17). The exporter writes it instead of `target`
/ `target_fused` for a hybrid family (families/qwen3_5.py); the runtime runs it as
`HybridTargetModel` (runtime/targets.py; I/O: `io_tables.GRAPHS["target_hybrid"]`).

Its torch reference is `models/linear_attention.HybridModel.step`: full-attention layers read and
return K/V like the dense target; the Gated DeltaNet layers run the delta rule in the chunk-parallel
form of models/linear_attention.py's docstring for the call's T tokens at once. The unit-lower
triangular system (I + A) U = R, which has no ONNX op, is solved by inverting I + A in blocks that
double in size (`_unit_lower_inverse`: ceil(log2 MAX_TOKENS) levels, block forward substitution,
as stable as the reference's triangular solve).

Speculative rollback without storing a state per token: a call returns the states it *started* from
and, per token, the rows the unrolled rule needs (conv input, k, u, cumulative log decay; ~1/250 of
a recurrent state at Qwen3.5-4B's dims). The next call gets those and `kept` (how many of its tokens
were accepted) and first rebuilds the states after exactly those tokens (`_commit`: a slice of the
conv rows and one rank-`kept` update of the recurrent state), so a partial accept costs what a full
one does and nothing is re-run.

>>> job = TargetJob(cfg, ckpt, capture=(1,), store=store)  # doctest: +SKIP
>>> build_hybrid_target(job, Path("b/target_hybrid.onnx"))  # doctest: +SKIP
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
    Keys,
    Layer,
    apply_rope,
    attend,
    float_min,
    int_range,
    linear,
    mlp,
    rope_at,
    rope_table,
    split_past,
    stack_new,
)
from .portable_target import causal_mask, logit_rows, untied_head
from .target_job import TargetJob

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


def _unit_lower_inverse(g: GraphBuilder, a: str, eye: str, quadrants: tuple[str, ...]) -> str:
    """(I + A)^-1 for strictly lower A [h, T, T] (T <= MAX_TOKENS) by recursive doubling: if X
    inverts I + A's diagonal blocks of size b, X - X (A * M_b) X inverts its blocks of size 2b
    (`quadrants` M_b [T, T]: each 2b block's lower-left b x b quadrant), from X = I - A * M_1.
    Block forward substitution, as stable as the reference's solve_triangular: X holds only the
    inverse's own entries. (The product (I - A)(I + A^2)(I + A^4)... cancels catastrophically where
    the decay is slow and keys align: 1e9 off at T = 64 in fp32.)"""
    inverse = g.op("Sub", [eye, g.op("Mul", [a, quadrants[0]])])
    for quadrant in quadrants[1:]:
        low = g.op("MatMul", [inverse, g.op("Mul", [a, quadrant])])  # [h, T, T]
        inverse = g.op("Sub", [inverse, g.op("MatMul", [low, inverse])])
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


def _conv_mix(g: GraphBuilder, h: str, cfg, ckpt, name: str, conv_state: str) -> tuple:
    """(qkv [T, Cv], then q, k, v of the causal depthwise conv over [conv state ; qkv], SiLU'd)."""
    qkv = linear(g, h, ckpt, f"{name}.in_proj_qkv", False)  # [T, Cv]
    seq = g.op("Concat", [conv_state, g.op("Transpose", [qkv], perm=[1, 0])], axis=1)  # [Cv, K-1+T]
    batched = g.op("Unsqueeze", [seq, g.const([0])])  # [1, Cv, K-1+T]
    weight = g.init(f"{name}.conv1d.weight", lambda: ckpt.array(f"{name}.conv1d.weight"))
    conv = g.op("Conv", [batched, weight], group=cfg.conv_dim)  # [1, Cv, T]
    # [T, Cv]
    mixed = g.op("Transpose", [_silu(g, g.op("Squeeze", [conv, g.const([0])]))], perm=[1, 0])
    kd = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    sizes = g.const([kd, kd, cfg.value_dim])
    return (qkv, *g.ops("Split", [mixed, sizes], 3, axis=1))


def _keyed(g: GraphBuilder, t: str, hk: int, hv: int, dk: int) -> str:
    """[T, Hk*Dk] -> L2-normalised, one copy per value head [Hv, T, Dk]."""
    t = g.op("Reshape", [t, g.const([-1, hk, 1, dk])])  # [T, Hk, 1, Dk]
    squares = g.op("ReduceSum", [g.op("Mul", [t, t]), g.const([-1])], keepdims=1)
    t = g.op("Div", [t, g.op("Sqrt", [g.op("Add", [squares, g.scalar(1e-6)])])])
    t = g.op("Expand", [t, g.const([1, hk, hv // hk, dk])])  # [T, Hk, G, Dk]
    return g.op("Transpose", [g.op("Reshape", [t, g.const([-1, hv, dk])])], perm=[1, 0, 2])


def _gates(g: GraphBuilder, h: str, ckpt, name: str) -> tuple[str, str]:
    """(beta [Hv, T], the cumulative log decay G_t [Hv, T]) of h [T, H]."""
    # [Hv, T]
    beta = g.op(
        "Transpose",
        [g.op("Sigmoid", [linear(g, h, ckpt, f"{name}.in_proj_b", False)])],
        perm=[1, 0],
    )
    a = linear(g, h, ckpt, f"{name}.in_proj_a", False)
    dt = g.op("Add", [a, g.init(f"{name}.dt_bias", lambda: ckpt.array(f"{name}.dt_bias"))])
    neg_a = g.init(f"{name}.-exp(A_log)", lambda: -np.exp(ckpt.array(f"{name}.A_log")))
    decay = g.op("Mul", [g.op("Softplus", [dt]), neg_a])
    return beta, g.op("CumSum", [g.op("Transpose", [decay], perm=[1, 0]), g.const(1)])


def _delta_rule(g: GraphBuilder, qkv: tuple, beta: str, cum: str, rec_state: str, tri) -> tuple:
    """The chunk-parallel delta rule over this call's T tokens (`qkv`: q, k [Hv, T, Dk], v [Hv, T,
    Dv]) from recurrent state `rec_state` [Hv, Dk, Dv] -> (o [Hv, T, Dv], u [Hv, T, Dv])."""
    (q, k, v), (lower, strict, eye, quadrants) = qkv, tri
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
    u = g.op("MatMul", [_unit_lower_inverse(g, a, eye, quadrants), rhs])  # [Hv, T, Dv]
    seen = g.op("Mul", [g.op("MatMul", [q, k_t]), gap])  # [Hv, T, T]
    o = g.op(
        "Add",
        [g.op("Mul", [grow, g.op("MatMul", [q, rec_state])]), g.op("MatMul", [seen, u])],
    )
    return o, u


def _gated_out(g: GraphBuilder, o: str, h: str, cfg, ckpt, name: str) -> str:
    """The rule's output o [Hv, T, Dv] RMS-normed per head and gated by SiLU(z(h)) -> [T, Hv*Dv]."""
    hv, dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    o = g.op("Transpose", [o], perm=[1, 0, 2])  # [T, Hv, Dv]
    mean = g.op("ReduceMean", [g.op("Mul", [o, o])], axes=[-1], keepdims=1)
    o = g.op("Div", [o, g.op("Sqrt", [g.op("Add", [mean, g.scalar(cfg.rms_norm_eps)])])])
    o = g.op("Mul", [o, g.init(f"{name}.norm.weight", lambda: ckpt.array(f"{name}.norm.weight"))])
    # [T, Hv, Dv]
    z = g.op("Reshape", [linear(g, h, ckpt, f"{name}.in_proj_z", False), g.const([-1, hv, dv])])
    return g.op("Reshape", [g.op("Mul", [o, _silu(g, z)]), g.const([-1, hv * dv])])  # [T, Hv*Dv]


def gated_deltanet(g: GraphBuilder, h: str, cfg, layer: Layer, carried: Carried, tri):
    """One linear layer (`layer.prefix`.linear_attn): h [T, H] after the previous call (`carried`)
    -> (out [T, H], (conv state [Cv, K-1], recurrent state [Hv, Dk, Dv]) at this call's start, and
    this call's rows for the next one: qkv [T, Cv], k [T, Hv, Dk], u [T, Hv, Dv], decay [T, Hv]).
    `tri`: `_masks`' (lower incl. diagonal, strictly lower, identity, the solve's quadrants)."""
    ckpt, name = layer.ckpt, f"{layer.prefix}.linear_attn"
    hk, hv, dk = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim
    conv_state, rec_state = _commit(g, carried, hv, cfg.linear_conv_kernel_dim - 1)
    qkv, q, k, v = _conv_mix(g, h, cfg, ckpt, name, conv_state)
    q = g.op("Mul", [_keyed(g, q, hk, hv, dk), g.scalar(1 / math.sqrt(dk))])  # [Hv, T, Dk]
    k, v = _keyed(g, k, hk, hv, dk), _heads(g, v, hv, cfg.linear_value_head_dim)  # [Hv, T, Dv]
    beta, cum = _gates(g, h, ckpt, name)
    o, u = _delta_rule(g, (q, k, v), beta, cum, rec_state, tri)
    o = _gated_out(g, o, h, cfg, ckpt, name)
    # [T, ...] each
    rows = (
        qkv,
        g.op("Transpose", [k], perm=[1, 0, 2]),
        g.op("Transpose", [u], perm=[1, 0, 2]),
        g.op("Transpose", [cum], perm=[1, 0]),
    )
    return linear(g, o, ckpt, f"{name}.out_proj", False), (conv_state, rec_state), rows


def gated_attention(g: GraphBuilder, h: str, cfg, layer: Layer, keys: Keys):
    """One full layer (`layer.prefix`.self_attn): h [T, H] after `keys.past` (K, V [1, Hkv, S, D])
    -> (out [T, H], new K, new V [1, Hkv, T, D])."""
    s, ckpt, name = layer.spec, layer.ckpt, f"{layer.prefix}.self_attn"
    hq, hkv, d, rot = s.num_heads, s.num_kv_heads, s.head_dim, cfg.rotary_dim
    bias, cos, sin = s.qkv_bias, keys.rope.cos_q, keys.rope.sin_q
    # [T, Hq, 2D]
    qg = g.op("Reshape", [linear(g, h, ckpt, f"{name}.q_proj", bias), g.const([-1, hq, 2 * d])])
    q, gate = g.ops("Split", [qg, g.const([d, d])], 2, axis=2)

    def place(t: str, norm: str | None) -> str:  # [T, n, D] -> normed, [1, n, T, D], rotated
        t = centred_norm(g, t, ckpt, f"{name}.{norm}", s.rms_norm_eps) if norm else t
        return g.op("Unsqueeze", [g.op("Transpose", [t], perm=[1, 0, 2]), g.const([0])])

    def projected(proj: str) -> str:  # [T, Hkv, D]
        return g.op("Reshape", [linear(g, h, ckpt, f"{name}.{proj}", bias), g.const([-1, hkv, d])])

    q = apply_rope(g, place(q, "q_norm"), cos, sin, d, rot)
    k = apply_rope(g, place(projected("k_proj"), "k_norm"), cos, sin, d, rot)
    v = place(projected("v_proj"), None)
    # [T, Hq*D]
    out = g.op("Reshape", [attend(g, q, (k, v), keys, s), g.const([-1, hq * d])])
    out = g.op("Mul", [out, g.op("Sigmoid", [g.op("Reshape", [gate, g.const([-1, hq * d])])])])
    return linear(g, out, ckpt, f"{name}.o_proj", s.o_bias), k, v


def _same_block(g: GraphBuilder, at: tuple[str, str], size: int) -> str:
    """[T, T] bool: row and column (`at`: offsets [T, 1], [1, T]) in one block of `size`."""
    rows, cols = (g.op("Div", [x, g.const(size)]) for x in at)
    return g.op("Equal", [rows, cols])


def _masks(g: GraphBuilder, offsets: str) -> tuple:
    """(lower incl. diagonal bool, strictly lower float, identity float, `_unit_lower_inverse`'s
    quadrants: float per block size b = 1, 2, 4 .. MAX_TOKENS/2) [T, T] over this call's tokens."""
    rows, cols = (
        g.op("Unsqueeze", [offsets, g.const([1])]),
        g.op("Unsqueeze", [offsets, g.const([0])]),
    )
    as_float = lambda b: g.op("Cast", [b], to=1)  # noqa: E731
    at = rows, cols
    quadrants = tuple(
        as_float(g.op("And", [_same_block(g, at, 2 * b), g.op("Not", [_same_block(g, at, b)])]))
        for b in (2**i for i in range(math.ceil(math.log2(MAX_TOKENS))))
    )
    return (
        g.op("GreaterOrEqual", [rows, cols]),
        as_float(g.op("Greater", [rows, cols])),
        as_float(g.op("Equal", [rows, cols])),
        quadrants,
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


def _call_inputs(g: GraphBuilder, cfg, reach: int | None) -> tuple:
    """(the RoPE rows of this call's positions [T, R], the causal mask over [past ; new], `_masks`'
    triangles)."""
    num_new = g.op("Shape", ["input_ids"], start=1, end=2)  # [1] = T
    num_past = g.op("Shape", ["past_key"], start=0, end=1)  # [1] = S
    offsets = int_range(g, num_new)  # [T]
    table = rope_table(g, "rope", cfg, cfg.rotary_dim, reach)
    rope = rope_at(g, table, g.op("Add", ["start", offsets]))  # [T, R]
    mask = causal_mask(
        g, num_new, num_past, offsets, cfg.num_attention_heads // cfg.num_key_value_heads
    )
    return rope, mask, _masks(g, offsets)


def _carry_in(g: GraphBuilder, cfg) -> tuple[dict, dict]:
    """(full layer -> its past (K, V), linear layer -> its `Carried`) from the graph inputs."""
    linear_ids = cfg.linear_layers
    full_ids = [i for i in range(cfg.num_hidden_layers) if i not in linear_ids]
    keys = split_past(g, "past_key", len(full_ids))
    past = dict(zip(full_ids, zip(keys, split_past(g, "past_value", len(full_ids)))))
    return past, dict(zip(linear_ids, _carried(g, len(linear_ids))))


def _decoder(g: GraphBuilder, x: str, job, call: tuple, carry: tuple) -> tuple[str, dict, dict]:
    """Every decoder layer on x [T, H] (`call`: `_call_inputs`, `carry`: `_carry_in`) -> (x,
    captured hidden states, this call's outputs per kind: new_k / new_v / starts / rows)."""
    cfg, ckpt, p = job.tc, job.ckpt, job.tc.weight_prefix
    (rope, mask, tri), (past, carried) = call, carry
    spec, eps = attention_spec(cfg), cfg.rms_norm_eps
    made = {"new_k": [], "new_v": [], "starts": [], "rows": []}
    captured = {}
    for i, kind in enumerate(cfg.layer_types):
        layer = Layer(ckpt, f"{p}.layers.{i}", spec)
        h = centred_norm(g, x, ckpt, f"{layer.prefix}.input_layernorm", eps)
        if kind == LINEAR:
            h, state, mine = gated_deltanet(g, h, cfg, layer, carried[i], tri)
            made["starts"].append(state)
            made["rows"].append(mine)
        else:
            h, k, v = gated_attention(g, h, cfg, layer, Keys(rope, past[i], mask))
            made["new_k"].append(k)
            made["new_v"].append(v)
        x = g.op("Add", [x, h])
        normed = centred_norm(g, x, ckpt, f"{layer.prefix}.post_attention_layernorm", eps)
        x = g.op("Add", [x, mlp(g, normed, layer)])  # [T, H]
        if i in job.capture:
            captured[i] = x
    return x, captured, made


def _hybrid_dims(cfg, capture: tuple[int, ...]) -> dict[str, int]:
    """The fixed symbols of the graph's I/O (io_tables `target_hybrid`)."""
    return {
        "Lf": cfg.num_hidden_layers - len(cfg.linear_layers),
        "Ll": len(cfg.linear_layers),
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


def build_hybrid_target(job: TargetJob, out: Path) -> Path:
    """Write the hybrid target graph of `job.tc` to `out` (weights appended to `job.store` as
    they are read, in its `target_hybrid` format: the projections and the embedding / head at the
    bundle's precision, export/weight_format.py)."""
    if job.opts is not None:
        check_options(job.opts)
    cfg, ckpt, p = job.tc, job.ckpt, job.tc.weight_prefix
    # its weights go to the target's data file (DATA_FILES)
    g = job.builder(GRAPH)
    call = _call_inputs(g, cfg, job.reach)
    embed = embedding_table(g, ckpt, f"{p}.embed_tokens.weight")  # shared with the drafter
    x = embed.gather(g.op("Squeeze", ["input_ids", g.const([0])]))  # [T, H]
    x, captured, made = _decoder(g, x, job, call, _carry_in(g, cfg))
    hidden = g.op("Concat", [captured[i] for i in job.capture], axis=-1)  # [T, N]
    g.op("Unsqueeze", [hidden, g.const([0])], "hidden")  # [1, T, N]
    normed = centred_norm(g, logit_rows(g, x, 0), ckpt, f"{p}.norm", cfg.rms_norm_eps)  # [R, H]
    head = embed.head(normed) if cfg.tie_word_embeddings else untied_head(g, normed, ckpt)  # [R, V]
    g.op("Unsqueeze", [head, g.const([0])], "logits")  # [1, R, V]
    g.op("ArgMax", ["logits"], "next_ids", axis=-1, keepdims=0)  # [1, R]
    stack_new(g, made["new_k"], "new_key")  # [T, Lf, Hkv, D]
    stack_new(g, made["new_v"], "new_value")
    for j, out_name in enumerate(("conv_start", "rec_start")):  # [Ll, ...]: this call's
        _stack(g, [s[j] for s in made["starts"]], out_name, 0)  # starting states
    for j, out_name in enumerate(("qkv", "delta_k", "delta_u", "decay")):  # [T, Ll, ...]: its rows
        _stack(g, [r[j] for r in made["rows"]], out_name, 1)
    return g.save(out, _hybrid_dims(cfg, job.capture), {"": OPSET})

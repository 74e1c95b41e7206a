"""The sparse mixture-of-experts MLP (models/moe.SparseMoE) written node by node, in two forms that
read only the chosen experts' weights:

- `moe_gather` (portable, opset 17, what TensorRT parses): softmax router -> TopK -> per slot, a
  Gather of each token's expert from the stacked weights -> batched MatMul -> weighted and added
  over the k slots.
- `moe_fused` (target_fused, CPU): onnxruntime's com.microsoft `MoE` op (fp32 experts) or `QMoE`
  (int4 / int8 experts) on the same stacked weights, fed one top-1 row per (token, slot) so that a
  token's output does not depend on the other tokens of the call (see `moe_fused`). It runs each
  chosen expert once on the rows that chose it, so a verify of T tokens reads each distinct expert
  once (measured against the gather: benchmarks/moe_slice.py).

Both use one stack per projection and sparse layer (the two flavours share them in
target.onnx.data): `fc1` [E, 2I, H] with gate and up rows interleaved (row 2i = gate_i, 2i + 1 =
up_i: the only SwiGLU layout the CPU kernels take) and `fc2` [E, H, I] (the experts' down_proj as
stored). Each is built in a lambda from the per-expert checkpoint tensors, so it is read only when
the store writes it. The router stays fp32 (a quantised router can pick other experts).

At int4 / int8 (`g.fmt.bits`) each expert is quantised as it is read (models/nbits.rtn: read one
expert, quantise, append its codes, drop it; never an fp32 copy of all experts): `fc1_Q4` uint8 [E,
2I, H*bits/8] (rtn's rows, low nibble first, zero point 2^(bits-1)) and `fc1_scales` fp32 [E, 2I,
H/bs], `fc2` likewise. QMoE reads them directly (accuracy_level as MatMulNBits'); the portable graph
Gathers the chosen experts' codes and scales and dequantises them with standard ops ((q - zp) *
scale, the same arithmetic as models/nbits.dequantize, so both flavours compute with exactly the
weights parity's StoredWeights reference sees: each expert tensor's recipe is recorded in the
FormatLog).

>>> y = moe_gather(g, h, ckpt, "model.layers.0", MoESpec(2048, 128, 8, 768, True))  # doctest: +SKIP
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..models.nbits import rtn
from ..runtime.errors import DflashEdgeError
from .graph_builder import MS, GraphBuilder

FLOAT = 1  # TensorProto.FLOAT


def expert_fc1(ckpt, prefix: str, m, e: int) -> np.ndarray:
    """Expert `e`'s gate and up rows interleaved, [2I, H] (row 2i = gate_i, 2i + 1 = up_i), as read
    from `ckpt`."""
    experts = f"{prefix}.mlp.experts.{e}"
    out = np.empty((2 * m.intermediate, m.hidden_size), np.float32)  # [2I, H]
    out[0::2] = ckpt.array(f"{experts}.gate_proj.weight", (m.intermediate, m.hidden_size))
    out[1::2] = ckpt.array(f"{experts}.up_proj.weight", (m.intermediate, m.hidden_size))
    return out


def expert_fc2(ckpt, prefix: str, m, e: int) -> np.ndarray:
    """Expert `e`'s down_proj [H, I] as stored."""
    return ckpt.array(f"{prefix}.mlp.experts.{e}.down_proj.weight", (m.hidden_size, m.intermediate))


class StackKind(NamedTuple):
    """One projection's stack: how an expert's matrix is read, its [N, K], and the checkpoint
    tensors it holds."""

    name: str
    read: object
    rows: object  # m -> N
    cols: object  # m -> K
    tensors: tuple[str, ...]


FC1 = StackKind(
    "fc1",
    expert_fc1,
    lambda m: 2 * m.intermediate,
    lambda m: m.hidden_size,
    ("gate_proj", "up_proj"),
)
FC2 = StackKind(
    "fc2", expert_fc2, lambda m: m.hidden_size, lambda m: m.intermediate, ("down_proj",)
)


class Stack(NamedTuple):
    """A stack's initializers: fp32 `weights` [E, N, K] (scales None), or uint8 codes [E, N,
    K*bits/8] + fp32 scales [E, N, K/bs]."""

    weights: str
    scales: str | None
    n: int
    k: int


def expert_blocks(g: GraphBuilder, m) -> tuple[int, int]:
    """(bits, block size) of the experts: (0, 0) for float experts; QMoE needs blocks dividing H and
    I."""
    bits, bs = g.fmt.bits, g.fmt.block_size
    if bits and (m.hidden_size % bs or m.intermediate % bs or bs < 16 or bs & (bs - 1)):
        raise DflashEdgeError(
            f"int{bits} experts in blocks of {bs}: onnxruntime's QMoE needs a power-of-two block "
            f">= 16 dividing hidden_size {m.hidden_size} and moe_intermediate_size "
            f"{m.intermediate}; "
            f"export with quant_block set to such a size (e.g. 16 or 32)"
        )
    return (bits, bs) if bits else (0, 0)


def stacked(g: GraphBuilder, ckpt, prefix: str, m, kind: StackKind) -> Stack:
    """Stack `kind` of the sparse layer at `prefix`, filled expert by expert when the store writes
    it."""
    bits, bs = expert_blocks(g, m)
    n, k, key = kind.rows(m), kind.cols(m), f"{prefix}.mlp.experts.{kind.name}"
    if not bits:

        def fp32():
            out = np.empty((m.num_experts, n, k), np.float32)  # [E, N, K]
            for e in range(m.num_experts):
                out[e] = kind.read(ckpt, prefix, m, e)
            return out

        return Stack(g.init(f"{key}_interleaved" if kind is FC1 else key, fp32), None, n, k)
    # what parity's reference must dequantise; weights_by_source counts
    for e in range(m.num_experts):
        for t in kind.tensors:
            g.log.stored[(ckpt.root, f"{prefix}.mlp.experts.{e}.{t}.weight")] = ("rtn", bits, bs)
            g.log.count(g.graph, "rtn")
    memo: dict = {}

    def build() -> dict:
        codes = np.empty((m.num_experts, n, k * bits // 8), np.uint8)  # [E, N, K*bits/8]
        scales = np.empty((m.num_experts, n, k // bs), np.float32)  # [E, N, K/bs]
        # one expert's fp32 matrix at a time: read, quantised, dropped
        for e in range(m.num_experts):
            w = rtn(kind.read(ckpt, prefix, m, e), bits, bs)
            codes[e] = w.B.reshape(n, -1)  # [N, K*bits/8]
            scales[e] = w.scales
        return {"codes": codes, "scales": scales}

    def part(name):
        def make():  # both parts come from one pass; each is handed over once
            if name not in memo:
                memo.update(build())
            return memo.pop(name)

        return make

    return Stack(
        g.init(f"{key}_Q{bits}", part("codes")), g.init(f"{key}_scales", part("scales")), n, k
    )


def router_logits(g: GraphBuilder, h: str, ckpt, prefix: str) -> str:
    """h [1, T, H] @ gate^T -> router logits [1, T, E] (fp32 weight)."""
    name = f"{prefix}.mlp.gate.weight"
    return g.op("MatMul", [h, g.init(f"{name}.T", lambda: ckpt.array(name).T)])


def route(g: GraphBuilder, h: str, ckpt, prefix: str, m) -> tuple[str, str]:
    """(weights [1, T, k], expert ids [1, T, k]) of tokens h [1, T, H]: softmax, top-k, renormalised
    if asked."""
    probs = g.op("Softmax", [router_logits(g, h, ckpt, prefix)], axis=-1)  # [1, T, E]
    # [1, T, k] each
    weights, ids = g.ops("TopK", [probs, g.const([m.top_k])], 2, axis=-1, largest=1, sorted=1)
    if m.norm_topk_prob:
        weights = g.op("Div", [weights, g.op("ReduceSum", [weights, g.const([-1])], keepdims=1)])
    return weights, ids


def chosen(g: GraphBuilder, s: Stack, ids: str, m) -> str:
    """The stacked matrices of experts `ids` [R] as fp32 [R, N, K] (low-bit ones dequantised after
    the Gather, so only the chosen experts' codes are read)."""
    w = g.op("Gather", [s.weights, ids], axis=0)  # [R, N, K or K*bits/8]
    if s.scales is None:
        return w
    bits, bs = expert_blocks(g, m)
    q = g.op("Cast", [w], to=FLOAT)
    if bits == 4:  # byte = low + 16 * high, low nibble first (models/nbits.rtn)
        high = g.op("Floor", [g.op("Div", [q, g.scalar(16.0)])])  # [R, N, K/2]
        low = g.op("Sub", [q, g.op("Mul", [high, g.scalar(16.0)])])
        # [R, N, K/2, 1]
        pairs = [g.op("Reshape", [x, g.const([-1, s.n, s.k // 2, 1])]) for x in (low, high)]
        q = g.op("Concat", pairs, axis=-1)  # [R, N, K/2, 2]
    # [R, N, K/bs, bs]
    blocks = g.op(
        "Reshape",
        [g.op("Sub", [q, g.scalar(float(1 << (bits - 1)))]), g.const([-1, s.n, s.k // bs, bs])],
    )
    # [R, N, K/bs, 1]
    scales = g.op(
        "Reshape", [g.op("Gather", [s.scales, ids], axis=0), g.const([-1, s.n, s.k // bs, 1])]
    )
    return g.op("Reshape", [g.op("Mul", [blocks, scales]), g.const([-1, s.n, s.k])])  # [R, N, K]


def moe_gather(g: GraphBuilder, h: str, ckpt, prefix: str, m) -> str:
    """Sparse MLP on h [1, T, H] -> [1, T, H] with standard ops: slot by slot, each token's expert
    for that slot gathered and run, the slots' outputs weighted and added in slot order (as
    `moe_fused` adds them). One slot's experts are dequantised at a time, so a call of T tokens
    holds [T, 2I, H] of expert weights, not k times that (a 40-token prompt at Qwen3-Coder-30B-A3B's
    widths: 0.5 GB, against 4 GB for all slots at once)."""
    weights, ids = route(g, h, ckpt, prefix, m)  # [1, T, k] each
    fc1, fc2 = stacked(g, ckpt, prefix, m, FC1), stacked(g, ckpt, prefix, m, FC2)
    x = g.op("Reshape", [h, g.const([-1, m.hidden_size, 1])])  # [T, H, 1]
    slot_ids = g.ops("Split", [ids, g.const([1] * m.top_k)], m.top_k, axis=-1)  # k x [1, T, 1]
    slot_weights = g.ops("Split", [weights, g.const([1] * m.top_k)], m.top_k, axis=-1)
    out = None
    for ids_s, weight_s in zip(slot_ids, slot_weights):
        flat_ids = g.op("Reshape", [ids_s, g.const([-1])])  # [T]
        gate_up = g.op("MatMul", [chosen(g, fc1, flat_ids, m), x])  # [T, 2I, 1]
        pairs = g.op("Reshape", [gate_up, g.const([-1, m.intermediate, 2])])  # [T, I, 2]
        gate, up = g.ops("Split", [pairs, g.const([1, 1])], 2, axis=-1)  # [T, I, 1] each
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), up])  # silu(gate) * up
        y = g.op("MatMul", [chosen(g, fc2, flat_ids, m), act])  # [T, H, 1]
        y = g.op("Mul", [y, g.op("Reshape", [weight_s, g.const([-1, 1, 1])])])
        out = y if out is None else g.op("Add", [out, y])
    return g.op("Reshape", [out, g.const([1, -1, m.hidden_size])])  # [1, T, H]


def _slot_rows(g: GraphBuilder, h: str, ids: str, m) -> tuple[str, str]:
    """(one-hot router [T*k, E] picking each (token, slot)'s expert, the rows [T*k, H]: each token
    once per slot)."""
    flat_ids = g.op("Reshape", [ids, g.const([-1])])  # [T*k]
    one_hot = g.op(
        "OneHot", [flat_ids, g.const(m.num_experts), g.const([0.0, 1.0], np.float32)], axis=-1
    )
    # [T, k, H]
    rows = g.op(
        "Expand",
        [g.op("Reshape", [h, g.const([-1, 1, m.hidden_size])]), g.const([1, m.top_k, 1])],
    )
    return one_hot, g.op("Reshape", [rows, g.const([-1, m.hidden_size])])  # [T*k, H]


def _experts_op(g: GraphBuilder, rows: str, one_hot: str, fc1, fc2, m) -> str:
    """onnxruntime's MoE (fp32 experts) or QMoE (blocks) as a top-1 call on `rows` -> [T*k, H]."""
    attrs = dict(
        k=1,
        activation_type="swiglu",
        swiglu_fusion=1,
        normalize_routing_weights=1,
        activation_alpha=1.0,
        activation_beta=0.0,
    )
    if fc1.scales is None:
        return g.op("MoE", [rows, one_hot, fc1.weights, "", fc2.weights], domain=MS, **attrs)
    bits, bs = expert_blocks(g, m)
    if bits == 8 and not g.fmt.accuracy_level:
        raise DflashEdgeError(
            "int8 experts with accuracy_level 0: onnxruntime's QMoE has no fp32-activation "
            "kernel for 8-bit experts, so the fused target cannot match the fp32 reference; "
            "export with accuracy_level 4 (the default), at int4, or without the fused target "
            "(--no-fused)"
        )
    return g.op(
        "QMoE",
        [rows, one_hot, fc1.weights, fc1.scales, "", fc2.weights, fc2.scales],
        domain=MS,
        **attrs,
        expert_weight_bits=bits,
        block_size=bs,
        accuracy_level=g.fmt.accuracy_level,
        weights_prepacked=0,
    )


def moe_fused(g: GraphBuilder, h: str, ckpt, prefix: str, m) -> str:
    """Sparse MLP on h [1, T, H] -> [1, T, H] as onnxruntime's com.microsoft MoE / QMoE.

    Routing stays outside the op: each (token, slot) is its own row of a top-1 call whose one-hot
    router picks the slot's expert with weight exactly 1 (one weight renormalised), and a token's k
    rows are weighted and added in slot order here. The op's own k-way sum runs in an order that
    depends on the other tokens of the call, so a token's output would differ by an ulp between a
    decode and a verify; top-1 rows do not (benchmarks/moe_slice.py op: rows_stable). The op still
    runs each chosen expert once on all the rows that chose it."""
    weights, ids = route(g, h, ckpt, prefix, m)  # [1, T, k] each
    one_hot, rows = _slot_rows(g, h, ids, m)
    fc1, fc2 = stacked(g, ckpt, prefix, m, FC1), stacked(g, ckpt, prefix, m, FC2)
    y = _experts_op(g, rows, one_hot, fc1, fc2, m)  # [T*k, H]
    # [T, k, H]
    slots = g.op(
        "Mul",
        [
            g.op("Reshape", [y, g.const([-1, m.top_k, m.hidden_size])]),
            g.op("Reshape", [weights, g.const([-1, m.top_k, 1])]),
        ],
    )
    parts = g.ops("Split", [slots, g.const([1] * m.top_k)], m.top_k, axis=1)  # k x [T, 1, H]
    out = parts[0]
    for part in parts[1:]:  # slot order, elementwise: the same sum for every T
        out = g.op("Add", [out, part])
    return g.op("Reshape", [out, g.const([1, -1, m.hidden_size])])  # [1, T, H]

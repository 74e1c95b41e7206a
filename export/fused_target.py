"""The fused-attention target graph (`target_fused`), written node by node with `onnx.helper`.

Per layer: SkipSimplifiedLayerNormalization (residual add + RMSNorm in one op; RMSNormalization
where there is no residual), one packed q/k/v MatMul, optional bias / per-head q/k RMSNorm, then
onnxruntime's `GroupQueryAttention` on the packed input with `do_rotary` and one zero row appended
(see `_attention`) (cos/sin tables from `models/rope.py`, as the torch reference's, so llama3 / yarn
scaling carry over) over a per-layer head-major KV buffer `[1, Hkv, Smax, D]` that the runtime binds
as both past and present: the op writes the new rows in place and reads the prefix where it lies (no
per-step copy of the cache). The LM head is `Gemm(x, W[V, H], transB=1)` on the embedding itself
when tied, a MatMul on W^T when not, like the portable graph.

Weights are read tensor by tensor from the checkpoint into the bundle's `WeightStore`, which
references every tensor the portable graph already stores (by name, or byte for byte: in
`target.onnx.data`, or the embedding in `shared.onnx.data`) instead of storing it again: the two
flavours share one copy of the weights.

>>> build_fused_target(job, Path("b/target_fused.onnx"), mlps)  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..models import family_spec
from ..models.rope import rope_tables
from .graph_builder import MS, OPSET_FUSED, GraphBuilder
from .portable_layers import Layer, linear, packed_qkv
from .portable_target import embedding, lm_head, target_dims

if TYPE_CHECKING:
    from .target_job import MlpWriters, TargetJob


def _norm_weight(g: GraphBuilder, ckpt, name: str) -> str:
    return g.init(f"{name}.weight", lambda: ckpt.array(f"{name}.weight"))


def _head_norm(g: GraphBuilder, x: str, layer: Layer, norm: str, heads: int) -> str:
    """Per-head RMSNorm (qwen3's q_norm / k_norm) on [1, T, heads * D]."""
    s = layer.spec
    split = g.op("Reshape", [x, g.const([0, 0, heads, s.head_dim])])  # [1, T, h, D]
    weight = _norm_weight(g, layer.ckpt, f"{layer.prefix}.self_attn.{norm}")
    normed = g.op("RMSNormalization", [split, weight], axis=-1, epsilon=s.rms_norm_eps)
    return g.op("Reshape", [normed, g.const([0, 0, heads * s.head_dim])])  # [1, T, h*D]


def _skip_norm(g: GraphBuilder, y: str, x: str, ckpt, name: str, eps: float) -> tuple[str, str]:
    """(RMSNorm(x + y), x + y) in one op: the residual add fused into the next norm."""
    # no mean/inv-std
    normed, _, _, total = g.ops(
        "SkipSimplifiedLayerNormalization",
        [y, x, _norm_weight(g, ckpt, name)],
        [f"{name}.out", "", "", f"{name}.residual"],
        domain=MS,
        epsilon=eps,
    )
    return normed, total


def _attention(g: GraphBuilder, h: str, layer: Layer, i: int, io: dict) -> str:
    """One layer's attention on normed input `h` [1, T, H] -> o_proj output [1, T, H].

    GroupQueryAttention gets one zero row after the T real ones (its output row is dropped): with T
    = 1 its probs x V product would otherwise take onnxruntime's single-row sgemm kernel, whose sums
    differ in the last bits from the multi-row kernel of a T = k verify step; quantised MatMuls
    amplify that into different tokens (measured: docs/BENCHMARKS.md). With >= 2 rows every step
    takes the same kernel and a decode row equals the same row of a verify step bit for bit. The
    extra row's K/V land one slot past the live ones and are overwritten by the next step (the
    runtime keeps that slot free)."""
    s = layer.spec
    qkv = packed_qkv(g, h, layer)  # [1, T, (Hq + 2Hkv) D]
    width = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    if s.qk_norm:  # per-head norms before rotary
        sizes = g.const([s.num_heads * s.head_dim, *[s.num_kv_heads * s.head_dim] * 2])
        q, k, v = g.ops("Split", [qkv, sizes], 3, axis=-1)
        q = _head_norm(g, q, layer, "q_norm", s.num_heads)
        k = _head_norm(g, k, layer, "k_norm", s.num_kv_heads)
        qkv = g.op("Concat", [q, k, v], axis=-1)
    # one constant for all layers
    pad = g.init(f"pad_row_{width}", np.zeros((1, 1, width), np.float32))
    padded = g.op("Concat", [qkv, pad], axis=1)  # [1, T + 1, (Hq + 2Hkv) D]
    out = g.ops(
        "GroupQueryAttention",  # present = past's buffer
        [
            padded,
            "",
            "",
            f"past_key.{i}",
            f"past_value.{i}",
            io["seqlens"],
            io["total"],
            io["cos"],
            io["sin"],
        ],
        [f"{layer.prefix}.self_attn.out_padded", f"present_key.{i}", f"present_value.{i}"],
        domain=MS,
        num_heads=s.num_heads,
        kv_num_heads=s.num_kv_heads,
        do_rotary=1,
        rotary_interleaved=0,
    )[0]
    # [1, T, Hq D]: pad row dropped
    real = g.op("Slice", [out, g.const([0]), g.const([-1]), g.const([1])])
    return linear(g, real, layer.ckpt, f"{layer.prefix}.self_attn.o_proj", s.o_bias)  # [1, T, H]


def _rope_halves(g: GraphBuilder, cfg, rows: int | None) -> dict:
    """GroupQueryAttention's cos/sin caches [P, D/2] (the halves of models/rope.py's tables; yarn's
    scale folded in; P = `rows`, the positions the bundle reaches)."""

    half = cfg.head_dim // 2
    tables = rope_tables(
        cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings, rows
    )
    return {
        "cos": g.init("rope.cos_cache", tables[0][:, :half]),
        "sin": g.init("rope.sin_cache", tables[1][:, :half]),
    }


def build_fused_target(job: TargetJob, out: Path, mlps: tuple[MlpWriters, ...]) -> dict:
    """Write `out` (the `target_fused` graph), its weights through `job.store`, each layer's MLP by
    its `mlps` writer; returns {reused, appended} bytes.

    Tensors the portable target already stored (same name in `target.onnx.data`, or the shared
    embedding / head, the packed q/k/v weights) are referenced, never read again; only the
    half-width rope caches are new."""
    cfg, ckpt, capture = job.tc, job.ckpt, job.capture
    spec, eps = family_spec(cfg), cfg.rms_norm_eps
    g = job.builder("target_fused")
    embed = embedding(g, ckpt)
    io = _rope_halves(g, cfg, job.reach)
    one32 = g.const(1, np.int32)
    io["seqlens"] = g.op("Add", ["seqlens_k", one32])  # lengths with the pad row
    io["total"] = g.op("Add", ["total_sequence_length", one32])
    x = embed.gather("input_ids")  # [1, T, H]
    h = g.op(
        "RMSNormalization",
        [x, _norm_weight(g, ckpt, "model.layers.0.input_layernorm")],
        axis=-1,
        epsilon=eps,
    )
    captured = {}
    for i in range(cfg.num_hidden_layers):
        layer = Layer(ckpt, f"model.layers.{i}", spec)
        a = _attention(g, h, layer, i, io)
        h, x = _skip_norm(g, a, x, ckpt, f"{layer.prefix}.post_attention_layernorm", eps)
        m = mlps[i].fused(g, h, layer)  # [1, T, H]
        last = i + 1 == cfg.num_hidden_layers
        h, x = _skip_norm(
            g, m, x, ckpt, "model.norm" if last else f"model.layers.{i + 1}.input_layernorm", eps
        )
        if i in capture:
            captured[i] = x
    g.op("Concat", [captured[i] for i in capture], "hidden", axis=-1)  # [1, T, N]
    lm_head(g, h, cfg, ckpt, embed, "logits")  # as the portable graph's head
    g.op("ArgMax", ["logits"], "next_ids", axis=-1, keepdims=0)  # [1, R]
    g.save(out, target_dims(cfg, capture), {"": OPSET_FUSED, MS: 1})
    return dict(job.store.stats["target_fused"])

"""The portable `target` graph, streamed from the checkpoint: I/O exactly
`io_tables.GRAPHS["target"]`.

The torch reference is `graphs.TargetGraph` (positions from `start`, causal mask from shapes, the
sequence-major KV layout, fused argmax); this writes the same computation node by node, reading one
weight at a time from the checkpoint, so no model is ever held in memory. The embedding (and an
untied LM head, stored as W^T) go to the shared file under the keys the drafter borrows them by.

>>> build_target(TargetJob(cfg, ckpt, (1, 4), store), Path("b/target.onnx"), mlps)  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..models import family_spec
from .dq_table import embedding_table
from .graph_builder import OPSET, GraphBuilder
from .portable_layers import (
    Keys,
    Layer,
    decoder_layer,
    float_min,
    int_range,
    rms_norm,
    rope_at,
    rope_table,
    split_past,
    stack_new,
)
from .weight_format import Table, Weight, matmul

if TYPE_CHECKING:
    from .target_job import MlpWriters, TargetJob

EMBED = "model.embed_tokens.weight"


def embedding(g: GraphBuilder, ckpt) -> Table:
    """The target's embedding table, stored once for every graph (fp32 or blocks:
    weight_format.Table; DequantizeLinear: dq_table.py)."""
    return embedding_table(g, ckpt, EMBED)


def untied_head(g: GraphBuilder, h: str, ckpt, out: str | None = None) -> str:
    """h @ lm_head^T, the weight shared with the drafter, at the table's precision."""
    head = Weight(ckpt, ["lm_head.weight"], "lm_head.weight", shared="lm_head")
    return matmul(g, h, head, out, bits=g.fmt.table_bits)


def logit_rows(g: GraphBuilder, h: str, axis: int) -> str:
    """The rows of `h` from the graph input `logits_from` on, along its token `axis` (T -> R): a
    prefill chunk needs the head on its last row only, a verify on all of them."""
    return g.op("Slice", [h, "logits_from", g.const([2**62]), g.const([axis])])


def lm_head(g: GraphBuilder, h: str, cfg, ckpt, embed: Table, out: str) -> str:
    """logits `out` [1, R, V] for the rows of `h` [1, T, H] from `logits_from` on: the embedding
    table itself when tied (Gemm with transB, or MatMulNBits on its blocks: stored once), the shared
    lm_head weight when not."""
    h = logit_rows(g, h, 1)  # [1, R, H]
    if cfg.tie_word_embeddings:
        flat = g.op("Reshape", [h, g.const([-1, cfg.hidden_size])])  # [R, H]
        logits = embed.head(flat)  # [R, V]
        return g.op("Reshape", [logits, g.const([1, -1, cfg.vocab_size])], out)  # [1, R, V]
    return untied_head(g, h, ckpt, out)


def causal_mask(g: GraphBuilder, num_new: str, num_past: str, offsets: str, rep: int) -> str:
    """Additive mask [rep*T, S + T]: new token t sees the past and new tokens 0..t (tiled over `rep`
    query heads)."""
    total = g.op("Add", [num_past, num_new])  # [1]
    keys = int_range(g, total)  # [S + T]
    limit = g.op("Unsqueeze", [g.op("Add", [num_past, offsets]), g.const([1])])  # [T, 1]
    allowed = g.op("LessOrEqual", [keys, limit])  # [T, S + T]
    mask = g.op("Where", [allowed, g.scalar(0.0), g.scalar(float_min())])
    return mask if rep == 1 else g.op("Tile", [mask, g.const([rep, 1])])  # [rep*T, S + T]


def target_dims(cfg, capture: tuple[int, ...]) -> dict[str, int]:
    """The fixed symbols of a dense target graph's I/O (io_tables), both flavours."""
    return {
        "L": cfg.num_hidden_layers,
        "Hkv": cfg.num_key_value_heads,
        "D": cfg.head_dim,
        "V": cfg.vocab_size,
        "H": cfg.hidden_size,
        "N": len(capture) * cfg.hidden_size,
    }


def build_target(job: TargetJob, out: Path, mlps: tuple[MlpWriters, ...]) -> Path:
    """Write the portable target graph to `out`, its weights appended to `job.store` as they are
    read; `mlps`: each layer's MLP writers (the family's); `job.reach`: the positions the bundle
    can see (its RoPE rows; default the model's max_position_embeddings)."""
    cfg, ckpt, capture = job.tc, job.ckpt, job.capture
    spec = family_spec(cfg)
    g = job.builder("target")
    num_new = g.op("Shape", ["input_ids"], start=1, end=2)  # [1] = T
    num_past = g.op("Shape", ["past_key"], start=0, end=1)  # [1] = S
    offsets = int_range(g, num_new)  # [T]
    positions = g.op("Add", ["start", offsets])  # [T]
    mask = causal_mask(g, num_new, num_past, offsets, spec.num_heads // spec.num_kv_heads)
    rope = rope_at(g, rope_table(g, "rope", cfg, rows=job.reach), positions)
    embed = embedding(g, ckpt)
    x = embed.gather("input_ids")  # [1, T, H]
    past_k = split_past(g, "past_key", cfg.num_hidden_layers)
    past_v = split_past(g, "past_value", cfg.num_hidden_layers)
    new_k, new_v, captured = [], [], {}
    for i, writers in enumerate(mlps):
        layer = Layer(ckpt, f"model.layers.{i}", spec, writers.portable)
        x, k, v = decoder_layer(g, x, layer, Keys(rope, (past_k[i], past_v[i]), mask))
        new_k.append(k)
        new_v.append(v)
        if i in capture:
            captured[i] = x
    g.op("Concat", [captured[i] for i in capture], "hidden", axis=-1)  # [1, T, N]
    h = rms_norm(g, x, ckpt, "model.norm", cfg.rms_norm_eps)
    lm_head(g, h, cfg, ckpt, embed, "logits")
    g.op("ArgMax", ["logits"], "next_ids", axis=-1, keepdims=0)  # [1, R]
    stack_new(g, new_k, "new_key")  # [T, L, Hkv, D]
    stack_new(g, new_v, "new_value")
    return g.save(out, target_dims(cfg, capture), {"": OPSET})

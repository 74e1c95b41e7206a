"""The portable `drafter` graph, streamed from the drafter's and the target's checkpoints: I/O
exactly `io_tables.GRAPHS["drafter"]`.

The torch reference is `graphs.DrafterGraph` over `drafter.DFlashDrafter.step`: context features
through `fc` + `hidden_norm`, then every draft layer attends from the block to [cached context ; new
context ; block] with no mask (a sliding-window layer: its window of [the W-1 positions before
`start` ; new context ; block], causal, by `_layer_mask`); the context's K/V are returned, the
block's dropped (full and sliding layers in separate outputs, io_tables); greedy ids from the
target's LM head. The embedding / LM head are the target's, referenced in the shared file (never a
second copy); a reduced draft vocabulary is the drafter's own tensor (its rows of the head).

>>> build_drafter(job, draft_cfg, draft_ckpt, Path("b/drafter.onnx"))   # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ..models.families.qwen3 import attention_spec
from .graph_builder import OPSET, GraphBuilder
from .portable_layers import (
    Keys,
    Layer,
    Rope,
    decoder_layer,
    float_min,
    int_range,
    linear,
    rms_norm,
    rope_rows,
    rope_table,
    split_past,
    stack_new,
)
from .portable_target import embedding, untied_head

if TYPE_CHECKING:
    from .target_job import TargetJob


class MaskKind(NamedTuple):
    """What one draft layer's mask depends on (layers of one kind share one mask)."""

    window: int | None  # sliding window W, or None (full)
    causal: bool
    sliding: bool  # reads the window cache (draft_config's window_layers)


class Positions(NamedTuple):
    """The drafter call's positions: context count [1] and rows [C], the block's rows [B]."""

    num_ctx: str
    ctx: str
    block: str


def _head(g: GraphBuilder, flat: str, tc, target_ckpt, embed, vocab) -> str:
    """Logits [B-1, V or |vocab|] for rows `flat` [B-1, H] from the target's (tied or untied) LM
    head."""
    if vocab is not None:  # the drafter's own rows of the head: [|vocab|, H] -> W^T
        head = "model.embed_tokens.weight" if tc.tie_word_embeddings else "lm_head.weight"
        rows = g.init(
            "lm_head.draft_vocab.weight.T", lambda: target_ckpt.array(head)[np.asarray(vocab)].T
        )
        return g.op("MatMul", [flat, rows])
    if tc.tie_word_embeddings:
        return embed.head(flat)
    return untied_head(g, flat, target_ckpt)


def _layer_mask(
    g: GraphBuilder, held: str, new_pos: str, block_pos: str, kind: MaskKind, rep: int
) -> str | None:
    """Additive mask [rep*B, K] over keys at positions [held ; new_pos] ([K]) for the block queries
    (draft_config's rule: a key is visible when its position is >= 0, within `kind.window` of the
    query, and not after it if `kind.causal`); None for a full non-causal layer (every key
    visible)."""
    window, causal = kind.window, kind.causal
    if window is None and not causal:
        return None
    keys = g.op("Concat", [held, new_pos], axis=0)  # [K]
    ahead = g.op("Sub", [g.op("Unsqueeze", [block_pos, g.const([1])]), keys])  # [B, K]: q - k
    # [B, K]
    keep = g.op("Expand", [g.op("GreaterOrEqual", [keys, g.const(0)]), g.op("Shape", [ahead])])
    if causal:
        keep = g.op("And", [keep, g.op("GreaterOrEqual", [ahead, g.const(0)])])
    if window is not None:
        keep = g.op("And", [keep, g.op("Less", [ahead, g.const(window)])])
        if not causal:  # nor W or more after
            keep = g.op("And", [keep, g.op("Less", [g.op("Neg", [ahead]), g.const(window)])])
    mask = g.op("Where", [keep, g.scalar(0.0), g.scalar(float_min())])  # [B, K]
    return mask if rep == 1 else g.op("Tile", [mask, g.const([rep, 1])])  # [rep*B, K]


def _positions(g: GraphBuilder, dc, block: int, reach: int | None) -> tuple[Positions, Rope]:
    """The call's positions (context from `start`, then the block) and their RoPE rows."""
    num_ctx = g.op("Shape", ["ctx_hidden"], start=1, end=2)  # [1] = C
    ctx_pos = g.op("Add", ["start", int_range(g, num_ctx)])  # [C]
    block_start = g.op("Add", ["start", num_ctx])  # [1]
    block_pos = g.op("Add", [block_start, g.const(np.arange(block))])  # [B]
    table = rope_table(g, "rope", dc, rows=reach)
    cos_q, sin_q = rope_rows(g, table, block_pos)  # [B, D]
    cos_kv, sin_kv = rope_rows(g, table, g.op("Concat", [ctx_pos, block_pos], axis=0))  # [C + B, D]
    return Positions(num_ctx, ctx_pos, block_pos), Rope(cos_q, sin_q, cos_kv, sin_kv)


def _inputs(g: GraphBuilder, job: TargetJob, dc, draft_ckpt, scale: float):
    """(the shared embedding table, the block's embeddings [1, B, H] (times `scale`), the context
    features [1, C, H] through `fc` and `hidden_norm`)."""
    embed = embedding(g, job.ckpt)
    x = embed.gather("block_ids")  # [1, B, H]
    if scale != 1.0:
        x = g.op("Mul", [x, g.scalar(scale)])
    # [1, C, H]
    ctx = rms_norm(
        g,
        linear(g, "ctx_hidden", draft_ckpt, "fc", False),
        draft_ckpt,
        "hidden_norm",
        dc.rms_norm_eps,
    )
    return embed, x, ctx


def _held(g: GraphBuilder, dc, full: list[int], slid: list[int]) -> dict:
    """layer -> (past K, past V, their positions): the full layers' cache [S] from 0, the sliding
    layers' window [W-1] the rows before `start`."""
    past = {}
    for layers, name, held in ((full, "past", None), (slid, "window", dc.sliding_window)):
        if not layers:
            continue
        keys, values = (split_past(g, f"{name}_{kv}", len(layers)) for kv in ("key", "value"))
        if held is None:  # [S]: 0 .. S-1
            positions = int_range(g, g.op("Shape", [f"{name}_key"], start=0, end=1))
        else:  # [W-1]: the rows before start
            positions = g.op("Add", ["start", g.const(np.arange(1 - held, 0))])
        past.update({i: (keys[j], values[j], positions) for j, i in enumerate(layers)})
    return past


def _draft_layers(g: GraphBuilder, x: str, dc, draft_ckpt, state: tuple, write_layer) -> tuple:
    """Every draft layer on the block `x` (`state`: the positions, the RoPE rows, `_held`'s past,
    the context features) -> (x [1, B, H], the context's new K and V per layer [1, Hkv, C, D])."""
    pos, rope, past, ctx = state
    spec = attention_spec(dc)
    new_pos = g.op("Concat", [pos.ctx, pos.block], axis=0)  # [C + B]
    rep, masks = spec.num_heads // spec.num_kv_heads, {}
    new_k, new_v = [], []
    zero, axis = g.const([0]), g.const([2])
    for i in range(dc.num_hidden_layers):
        kind = MaskKind(dc.window(i), dc.layer_causal(i), i in dc.window_layers)
        if kind not in masks:  # one mask per kind
            masks[kind] = _layer_mask(g, past[i][2], new_pos, pos.block, kind, rep)
        keys = Keys(rope, past[i][:2], masks[kind])
        x, k, v = write_layer(g, x, Layer(draft_ckpt, f"layers.{i}", spec), keys, ctx=ctx)
        new_k.append(g.op("Slice", [k, zero, pos.num_ctx, axis]))  # [1, Hkv, C, D]: block
        new_v.append(g.op("Slice", [v, zero, pos.num_ctx, axis]))  # K/V dropped
    return x, new_k, new_v


def _draft_ids(g: GraphBuilder, logits: str, vocab, block: int) -> str:
    """`draft_ids` [1, B-1]: the greedy rows of `logits` [B-1, V or |vocab|] as token ids."""
    ids = g.op("ArgMax", [logits], axis=-1, keepdims=0)  # [B-1]
    if vocab is not None:  # local row -> token id
        ids = g.op("Gather", [g.const(np.asarray(vocab)), ids], axis=0)
    return g.op("Reshape", [ids, g.const([1, block - 1])], "draft_ids")  # [1, B-1]


def _dims(job: TargetJob, dc, full: list[int], slid: list[int], block: int) -> dict[str, int]:
    """The fixed symbols of the drafter graph's I/O (io_tables)."""
    return {
        "Ld": len(full),
        "Lw": len(slid),
        "Wm1": (dc.sliding_window or 1) - 1,
        "Hkv": dc.num_key_value_heads,
        "D": dc.head_dim,
        "B": block,
        "Bm1": block - 1,
        "N": len(dc.target_layer_ids) * job.tc.hidden_size,
    }


def build_drafter(
    job: TargetJob, dc, draft_ckpt, out: Path, vocab=None, hooks: dict | None = None
) -> Path:
    """Write the drafter graph of `dc` (weights in `draft_ckpt`; the embedding / LM head the
    target's, `job.ckpt`) for blocks of `job.opts.block_size` tokens to `out`; `vocab`: sorted
    token ids of a reduced head; `job.reach`: the RoPE rows the bundle reaches; `hooks`: another
    generation's parts (dflash2_drafter.py: `embed_scale`, `layer` writer, `drafts` writer of the
    outputs from the draft rows, their logits and the table, `dims`)."""
    hooks, tc, block = hooks or {}, job.tc, job.opts.block_size
    g = job.builder("drafter")
    pos, rope = _positions(g, dc, block, job.reach)
    embed, x, ctx = _inputs(g, job, dc, draft_ckpt, hooks.get("embed_scale", 1.0))
    slid = dc.window_layers
    full = [i for i in range(dc.num_hidden_layers) if i not in slid]
    state = pos, rope, _held(g, dc, full, slid), ctx
    layer = hooks.get("layer", decoder_layer)
    x, new_k, new_v = _draft_layers(g, x, dc, draft_ckpt, state, layer)
    h = rms_norm(g, x, draft_ckpt, "norm", dc.rms_norm_eps)  # [1, B, H]
    drafted = g.op("Slice", [h, g.const([1]), g.const([block]), g.const([1])])  # [1, B-1, H]
    flat = g.op("Reshape", [drafted, g.const([-1, tc.hidden_size])])  # [B-1, H]
    logits = _head(g, flat, tc, job.ckpt, embed, vocab)  # [B-1, V]
    if "drafts" in hooks:
        hooks["drafts"](g, flat, logits, embed)
    else:
        _draft_ids(g, logits, vocab, block)
    for layers, name in ((full, "new"), (slid, "new_window")):  # [C, Ld or Lw, Hkv, D]
        if layers:
            stack_new(g, [new_k[i] for i in layers], f"{name}_key")
            stack_new(g, [new_v[i] for i in layers], f"{name}_value")
    dims = {**_dims(job, dc, full, slid, block), **hooks.get("dims", {})}
    return g.save(out, dims, {"": OPSET})

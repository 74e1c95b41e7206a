"""The portable `drafter` graph, streamed from the drafter's and the target's checkpoints: I/O exactly
`io_tables.GRAPHS["drafter"]`.

The torch reference is `graphs.DrafterGraph` over `drafter.DFlashDrafter.step`: context features through
`fc` + `hidden_norm`, then every draft layer attends from the block to [cached context ; new context ;
block] with no mask; the context's K/V are returned, the block's dropped; greedy ids from the target's
LM head. The embedding / LM head are the target's, referenced in the shared file (never a second copy);
a reduced draft vocabulary is the drafter's own tensor (its rows of the head).

>>> build_drafter(target_cfg, draft_cfg, ckpts, store, Path("b/drafter.onnx"))   # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .graph_builder import OPSET, GraphBuilder
from dflash_edge.models.qwen3 import attention_spec
from .portable_layers import Layer, Rope, decoder_layer, int_range, linear, rms_norm, rope_rows, rope_table, \
    split_past, stack_new, weight_t
from .portable_target import embedding


def _head(g: GraphBuilder, flat: str, tc, target_ckpt, embed: str, vocab) -> str:
    """Logits [B-1, V or |vocab|] for rows `flat` [B-1, H] from the target's (tied or untied) LM head."""
    if vocab is not None:                       # the drafter's own rows of the head: [|vocab|, H] -> W^T
        head = "model.embed_tokens.weight" if tc.tie_word_embeddings else "lm_head.weight"
        rows = g.init("lm_head.draft_vocab.weight.T", lambda: target_ckpt.array(head)[np.asarray(vocab)].T)
        return g.op("MatMul", [flat, rows])[0]
    if tc.tie_word_embeddings:
        return g.op("Gemm", [flat, embed], transB=1)[0]
    return g.op("MatMul", [flat, weight_t(g, target_ckpt, "lm_head.weight", shared="lm_head")])[0]


def build_drafter(tc, dc, target_ckpt, draft_ckpt, store, out: Path, block: int, vocab=None) -> Path:
    """Write the drafter graph for blocks of `block` tokens to `out`; `vocab`: sorted token ids of a reduced head."""
    spec = attention_spec(dc)
    g = GraphBuilder("drafter", store)
    num_ctx = g.op("Shape", ["ctx_hidden"], start=1, end=2)[0]                            # [1] = C
    ctx_pos = g.op("Add", ["start", int_range(g, num_ctx)])[0]                             # [C]
    block_start = g.op("Add", ["start", num_ctx])[0]                                       # [1]
    block_pos = g.op("Add", [block_start, g.const(np.arange(block))])[0]                   # [B]
    table = rope_table(g, "rope", dc)
    cos_q, sin_q = rope_rows(g, table, block_pos)                                          # [B, D]
    cos_kv, sin_kv = rope_rows(g, table, g.op("Concat", [ctx_pos, block_pos], axis=0)[0])  # [C + B, D]
    rope = Rope(cos_q, sin_q, cos_kv, sin_kv)
    embed = embedding(g, target_ckpt)
    x = g.op("Gather", [embed, "block_ids"], axis=0)[0]                                    # [1, B, H]
    ctx = rms_norm(g, linear(g, "ctx_hidden", draft_ckpt, "fc", False), draft_ckpt, "hidden_norm",
                   dc.rms_norm_eps)                                                        # [1, C, H]
    past_k = split_past(g, "past_key", dc.num_hidden_layers)
    past_v = split_past(g, "past_value", dc.num_hidden_layers)
    new_k, new_v = [], []
    zero, axis = g.const([0]), g.const([2])
    for i in range(dc.num_hidden_layers):
        x, k, v = decoder_layer(g, x, Layer(draft_ckpt, f"layers.{i}", spec), rope, (past_k[i], past_v[i]),
                                None, ctx=ctx)
        new_k.append(g.op("Slice", [k, zero, num_ctx, axis])[0])                          # [1, Hkv, C, D]: block
        new_v.append(g.op("Slice", [v, zero, num_ctx, axis])[0])                          # K/V dropped
    h = rms_norm(g, x, draft_ckpt, "norm", dc.rms_norm_eps)                               # [1, B, H]
    drafted = g.op("Slice", [h, g.const([1]), g.const([block]), g.const([1])])[0]          # [1, B-1, H]
    flat = g.op("Reshape", [drafted, g.const([-1, tc.hidden_size])])[0]                    # [B-1, H]
    ids = g.op("ArgMax", [_head(g, flat, tc, target_ckpt, embed, vocab)], axis=-1, keepdims=0)[0]   # [B-1]
    if vocab is not None:                                                                  # local row -> token id
        ids = g.op("Gather", [g.const(np.asarray(vocab)), ids], axis=0)[0]
    g.op("Reshape", [ids, g.const([1, block - 1])], ["draft_ids"])                         # [1, B-1]
    stack_new(g, new_k, "new_key")                                                         # [C, Ld, Hkv, D]
    stack_new(g, new_v, "new_value")
    dims = {"Ld": dc.num_hidden_layers, "Hkv": dc.num_key_value_heads, "D": dc.head_dim, "B": block,
            "Bm1": block - 1, "N": len(dc.target_layer_ids) * tc.hidden_size}
    return g.save(out, dims, {"": OPSET})

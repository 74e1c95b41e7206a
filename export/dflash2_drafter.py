"""The `drafter` graph of a DFlash2 drafter: portable_drafter's graph with DFlash2's layers,
embedding scale and lattice outputs (torch reference: drafter.WindowedDrafterGraph over dflash2.py).

Each layer wraps its attention and MLP in grouped dynamic causal convolutions (`conv`: the block is
static, so a tap k is the block shifted down k rows with zeros before row 0). The draft rows' logits
(output multiplier, softcap) give Kc candidates per position (TopK) and the pairwise scores
`unary[r, j] + <A[pred(r, m)] * (W h_r), B[cand(r, j)]>`; `draft_ids` is the greedy walk, unrolled
(runtime/lattice.py walks the same lattice on the host, greedy or sampled).

The conv and selector weights stay at >= 8 bits whatever the drafter's precision (4-bit codebooks
break the ranking): projections at 8 bits in an int4 / int8 graph, fp32 otherwise; the codebooks and
base taps are float tensors (`MANIFEST_NOTE`). The candidates are the reference's: a low-bit tied
head preselects `PRESELECT` x Kc rows at int8 activations and re-ranks them in fp32 from the table's
rows (`exact_top`); low-bit drafter layers or a low-bit untied head run at fp32 activations
(`weight_format`).

>>> build(job, dc, draft_ckpt, Path("b/drafter.onnx"))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .graph_builder import GraphBuilder
from .portable_drafter import build_drafter
from .portable_layers import Keys, Layer, attention, mlp, rms_norm
from .weight_format import Weight, matmul

if TYPE_CHECKING:
    from .target_job import TargetJob

PRESELECT = 4  # a low-bit tied head's candidates: the best 4 x Kc at int8 activations, re-ranked
MANIFEST_NOTE = (
    "DFlash2: conv taps and codebooks stored as float tensors, conv and selector projections at "
    "8 bits in an int4/int8 graph (fp32 otherwise): the ranking needs >= 8 bits"
)


@dataclass(frozen=True)
class ConvAt:
    """One of a layer's two convs: where its weights are (`name`: `layers.N.attention_conv` or
    `.mlp_conv`) and the dims (block, kernel, groups, group size)."""

    ckpt: object
    name: str
    dims: tuple[int, int, int, int]


def _wide(g: GraphBuilder, x: str, ckpt, name: str) -> str:
    """x @ `name.weight`^T at >= 8 bits (8 in a low-bit graph, else the graph's float)."""
    bits = 8 if g.fmt.bits else 0
    return matmul(g, x, Weight.named(ckpt, f"{name}.weight"), bits=bits)


def _pick(g: GraphBuilder, x: str, i: int, axis: int, shape: list[int]) -> str:
    """x's index `i` along `axis`, reshaped to `shape` (the axis dropped)."""
    return g.op("Reshape", [g.op("Gather", [x, g.const([i])], axis=axis), g.const(shape)])


def conv(g: GraphBuilder, x: str, dyn: str, at: ConvAt, side: int) -> str:
    """sum_k (base[side, k] + dyn[k]) * (x shifted down k rows) per channel group: x [1, B, H],
    dyn [1, B, K, G, 1] -> [1, B, H]."""
    (block, kernel, groups, group), ckpt, name = at.dims, at.ckpt, at.name
    xs = g.op("Reshape", [x, g.const([1, block, groups, group])])  # [1, B, G, g]
    out = None
    for k in range(min(kernel, block)):
        # [G, g]
        taps = g.init(
            f"{name}.base_kernel.{side}.{k}",
            lambda k=k: ckpt.array(f"{name}.base_kernel")[side, k].reshape(groups, group),
        )
        coef = g.op("Add", [taps, _pick(g, dyn, k, 2, [1, block, groups, 1])])  # [1, B, G, g]
        shifted = xs
        if k:
            zeros = g.const(np.zeros((1, k, groups, group)), np.float32)
            head = g.op("Slice", [xs, g.const([0]), g.const([block - k]), g.const([1])])
            shifted = g.op("Concat", [zeros, head], axis=1)
        term = g.op("Mul", [coef, shifted])
        out = term if out is None else g.op("Add", [out, term])
    return g.op("Reshape", [out, g.const([1, block, groups * group])])


def prepare(g: GraphBuilder, h: str, at: ConvAt) -> tuple[str, str]:
    """(conv of h, the finish conv's coefficients [1, B, K, G, 1]) for conv `at`."""
    block, kernel, groups, _ = at.dims
    dyn = _wide(g, h, at.ckpt, f"{at.name}.kernel_projection")  # [1, B, 2*K*G]
    dyn = g.op("Reshape", [dyn, g.const([1, block, 2, kernel, groups, 1])])
    first, second = (_pick(g, dyn, s, 2, [1, block, kernel, groups, 1]) for s in (0, 1))
    return conv(g, h, first, at, 0), second


def dflash2_layer(g, x, layer: Layer, keys: Keys, ctx=None, dims=None):
    """portable_layers.decoder_layer with a conv around each sublayer (dflash2.DFlash2Layer)."""
    eps, p, ckpt = layer.spec.rms_norm_eps, layer.prefix, layer.ckpt
    attn_conv, mlp_conv = (ConvAt(ckpt, f"{p}.{c}", dims) for c in ("attention_conv", "mlp_conv"))
    h = rms_norm(g, x, ckpt, f"{p}.input_layernorm", eps)
    h, dyn = prepare(g, h, attn_conv)
    kv_in = h if ctx is None else g.op("Concat", [ctx, h], axis=1)
    attn, k_new, v_new = attention(g, h, kv_in, layer, keys)
    x = g.op("Add", [x, conv(g, attn, dyn, attn_conv, 1)])
    h = rms_norm(g, x, ckpt, f"{p}.post_attention_layernorm", eps)
    h, dyn = prepare(g, h, mlp_conv)
    m = conv(g, mlp(g, h, layer), dyn, mlp_conv, 1)
    return g.op("Add", [x, m]), k_new, v_new


def exact_top(g: GraphBuilder, flat: str, logits: str, embed, top: int) -> tuple[str, str | None]:
    """(raw logits [R, P], their token ids [R, P]) of the P = `PRESELECT` x `top` best `logits`
    [R, V] of a low-bit tied head (MatMulNBits at accuracy level 4: int8 activations), recomputed
    in fp32 from the table's own rows (the reference's arithmetic, so the top `top` are the
    reference's candidates, at ~1/18 of the whole head's cost at level 0); `(logits, None)` for a
    float head or none given."""
    if embed is None or not embed.bits:
        return logits, None
    wide = min(top * PRESELECT, embed.ckpt.shape(embed.name)[0])
    _, ids = g.ops("TopK", [logits, g.const([wide])], 2, axis=-1, largest=1, sorted=1)  # [R, P]
    rows = embed.gather(ids)  # [R, P, H]: the stored rows, dequantised as the reference reads them
    exact = g.op("MatMul", [rows, g.op("Unsqueeze", [flat, g.const([2])])])  # [R, P, 1]
    return g.op("Squeeze", [exact, g.const([2])]), ids  # [R, P]


def needs_fp32_activations(fmt, tc) -> bool:
    """Whether the drafter graph's MatMulNBits must run at accuracy level 0 (fp32 activations) for
    its candidates to be the reference's: low-bit layers of its own, or a low-bit untied head (no
    exact rows to re-rank on). A low-bit tied head is re-ranked instead (`exact_top`)."""
    return bool(fmt.bits) or (bool(fmt.table_bits) and not tc.tie_word_embeddings)


def weight_format(fmt, tc):
    """The drafter graph's WeightFormat from the exporter's `fmt`: at accuracy level 0 where
    `needs_fp32_activations`, else `fmt`."""
    return replace(fmt, accuracy_level=0) if needs_fp32_activations(fmt, tc) else fmt


def lattice(g: GraphBuilder, flat: str, scored: tuple, dc, ckpt, block: int) -> None:
    """`candidate_ids`, `lattice_scores` and the greedy `draft_ids` from the draft rows `flat`
    [R, H] and `scored`: `exact_top`'s (their logits [R, P], those logits' token ids [R, P] or None
    where P = V)."""
    rows, top = block - 1, dc.selector_top_k
    logits, pre = scored
    logits = g.op("Mul", [logits, g.scalar(float(dc.output_multiplier))])
    cap = dc.final_logit_softcapping
    if cap is not None and float(cap) > 0:
        capped = g.op("Tanh", [g.op("Div", [logits, g.scalar(float(cap))])])
        logits = g.op("Mul", [capped, g.scalar(float(cap))])
    unary, cand = g.ops("TopK", [logits, g.const([top])], 2, axis=-1, largest=1, sorted=1)
    if pre is not None:  # index into the preselection -> token id
        cand = g.op("GatherElements", [pre, cand], axis=1)  # [R, Kc]
    proj = _wide(g, flat, ckpt, "candidate_selector.hidden_projection")  # [R, rank]
    anchor = g.op("Slice", ["block_ids", g.const([0, 0]), g.const([1, 1])])  # [1, 1]
    first = g.op("Expand", [anchor, g.const([1, top])])  # [1, Kc]
    if rows > 1:
        before = g.op("Slice", [cand, g.const([0]), g.const([rows - 1]), g.const([0])])
        pred = g.op("Concat", [first, before], axis=0)  # [R, Kc]: the candidates before
    else:
        pred = first
    books = {
        side: g.init(
            f"candidate_selector.{side}_codebook",
            lambda side=side: ckpt.array(f"candidate_selector.{side}_codebook"),
        )
        for side in ("predecessor", "successor")
    }
    a = g.op("Gather", [books["predecessor"], pred], axis=0)  # [R, Kc, rank]
    a = g.op("Mul", [a, g.op("Unsqueeze", [proj, g.const([1])])])
    b = g.op("Gather", [books["successor"], cand], axis=0)  # [R, Kc, rank]
    pair = g.op("MatMul", [a, g.op("Transpose", [b], perm=[0, 2, 1])])  # [R, Kc, Kc]
    scores = g.op("Add", [pair, g.op("Unsqueeze", [unary, g.const([1])])])
    g.op("Reshape", [scores, g.const([1, rows, top, top])], "lattice_scores")
    g.op("Reshape", [cand, g.const([1, rows, top])], "candidate_ids")
    index, path = g.const([0]), []
    for r in range(rows):  # the greedy walk, unrolled: row r's best candidate after the previous
        row = g.op("Gather", [_pick(g, scores, r, 0, [top, top]), index], axis=0)  # [1, Kc]
        index = g.op("ArgMax", [row], axis=1, keepdims=0)  # [1]
        path.append(g.op("Gather", [_pick(g, cand, r, 0, [top]), index], axis=0))  # [1]
    walk = path[0] if rows == 1 else g.op("Concat", path, axis=0)
    g.op("Reshape", [walk, g.const([1, rows])], "draft_ids")


def build(job: TargetJob, dc, draft_ckpt, out: Path, vocab=None) -> Path:
    """portable_drafter.build_drafter for a DFlash2 drafter (same arguments; no reduced vocab:
    the exporter refuses one)."""
    block = job.opts.block_size
    dims = (block, dc.conv_kernel_size, dc.conv_groups, dc.conv_group_size)
    tied, top = job.tc.tie_word_embeddings, dc.selector_top_k

    def drafts(g, flat, logits, embed):
        scored = exact_top(g, flat, logits, embed if tied else None, top)
        lattice(g, flat, scored, dc, draft_ckpt, block)

    hooks = {
        "embed_scale": float(dc.input_embedding_scale),
        "layer": partial(dflash2_layer, dims=dims),
        "drafts": drafts,
        "dims": {"Kc": dc.selector_top_k},
    }
    return build_drafter(job, dc, draft_ckpt, out, vocab, hooks=hooks)

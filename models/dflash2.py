"""The DFlash2 drafter in torch (z-lab's layout; config: dflash2_config.py).

Per layer, each sublayer's input passes a grouped dynamic causal convolution ("prepare") and its
output a second one ("finish", whose coefficients were computed from the sublayer's input):

    conv(x)[t] = sum_k (base[k] + dyn[t, k]) * x[t - k]   (per group of `conv_group_size` channels)

with dyn = `kernel_projection(sublayer input)` [T, 2, K, G] and x[t - k] = 0 before the block's
first position (taps never cross a block boundary). The block's positions 1..B-1 then give the
lattice: each position's top-k candidates of the target's LM head (unary scores) and, for every
pair of a candidate m at the previous position (the anchor for the first) and a candidate j here,

    score[r, m, j] = unary[r, j] + < A[pred(r, m)] * (W h_r), B[cand(r, j)] >

(A, B: the predecessor / successor codebooks, W: `hidden_projection`). The draft is the walk that
takes, position by position, the best (or a sampled) candidate given the one before
(runtime/lattice.py walks it on the host; `greedy_walk` is the same walk in torch).

drafter.DFlashDrafter builds these parts for a DFlash2Config (and `draft_lattice` reads them);
dflash2_weights.py makes random and converted DFlash2 drafters.

>>> drafter = load_drafter("dflash2-drafter/", target_config=target.config)  # doctest: +SKIP
"""

from __future__ import annotations

import torch
from torch import nn

from .dflash2_config import DFlash2Config
from .families.qwen3 import attention_spec
from .layers import DecoderLayer
from .target import lm_logits


def grouped_conv(x: torch.Tensor, dyn: torch.Tensor, base: torch.Tensor, group: int):
    """sum_k (base[k] + dyn[.., k, :]) * x shifted by k, per channel group.

    x [b, T, H], dyn [b, T, K, G], base [K, H]; positions before 0 are zeros."""
    b, t, hidden = x.shape
    groups = hidden // group
    xs = x.view(b, t, groups, group)
    out = torch.zeros_like(xs)
    for k in range(base.shape[0]):
        if k >= t:
            break
        shifted = torch.cat([xs.new_zeros(b, k, groups, group), xs[:, : t - k]], dim=1)
        coef = base[k].view(groups, group).to(x.dtype) + dyn[:, :, k, :, None]  # [b, T, G, g]
        out = out + coef * shifted
    return out.view_as(x)


class GroupedDynamicConv(nn.Module):
    """`base_kernel` [2, K, H] (prepare, finish) and `kernel_projection` [2*K*G, H]."""

    def __init__(self, hidden: int, kernel: int, group: int):
        super().__init__()
        self.kernel, self.group = kernel, group
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel * (hidden // group), bias=False)

    def prepare(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv of `h`, the finish conv's coefficients [b, T, K, G])."""
        dyn = self.kernel_projection(h).view(*h.shape[:-1], 2, self.kernel, -1)
        first = grouped_conv(h, dyn[..., 0, :, :], self.base_kernel[0], self.group)
        return first, dyn[..., 1, :, :]

    def finish(self, y: torch.Tensor, dyn: torch.Tensor) -> torch.Tensor:
        return grouped_conv(y, dyn, self.base_kernel[1], self.group)


class DFlash2Layer(DecoderLayer):
    """DecoderLayer with a conv around each sublayer; the context features enter the attention's
    keys/values unconvolved (z-lab's `target_hidden`)."""

    def __init__(self, cfg: DFlash2Config):
        super().__init__(attention_spec(cfg), cfg.intermediate_size)
        size = (cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
        self.attention_conv = GroupedDynamicConv(*size)
        self.mlp_conv = GroupedDynamicConv(*size)

    def forward(self, x, rope_q, past_k, past_v, mask, ctx=None, rope_kv=None):
        h, dyn = self.attention_conv.prepare(self.input_layernorm(x))
        kv_in = h if ctx is None else torch.cat([ctx, h], dim=1)
        attn, k_new, v_new = self.self_attn(
            h, rope_q, kv_in, rope_kv or rope_q, past_k, past_v, mask
        )
        x = x + self.attention_conv.finish(attn, dyn)
        h, dyn = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(h), dyn), k_new, v_new


class CandidateSelector(nn.Module):
    """Codebooks [V, rank] (no `.weight` suffix, as published) and `hidden_projection` [rank, H]."""

    def __init__(self, cfg: DFlash2Config):
        super().__init__()
        self.top_k = cfg.selector_top_k
        self.predecessor_codebook = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.selector_rank))
        self.successor_codebook = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.selector_rank))
        self.hidden_projection = nn.Linear(cfg.hidden_size, cfg.selector_rank, bias=False)

    def lattice(self, hidden, logits, anchor):
        """(candidates [b, R, k] int64, scores [b, R, k, k]) for rows `hidden` [b, R, H] with
        `logits` [b, R, V] after the token `anchor` [b]; scores[:, 0, m] is the same for every m."""
        unary, cand = torch.topk(logits, self.top_k, dim=-1)  # descending
        proj = self.hidden_projection(hidden)  # [b, R, rank]
        first = anchor.view(-1, 1, 1).expand(-1, 1, self.top_k)
        pred = torch.cat([first, cand[:, :-1]], dim=1)  # [b, R, k]: the candidates before
        a = self.predecessor_codebook[pred] * proj[:, :, None, :]  # [b, R, k, rank]
        pair = a @ self.successor_codebook[cand].transpose(-1, -2)  # [b, R, k (m), k (j)]
        return cand, unary[:, :, None, :] + pair


def greedy_walk(cand: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """The draft [b, R]: position by position the best candidate given the one chosen before."""
    rows, index, path = torch.arange(cand.shape[0]), torch.zeros_like(cand[:, 0, 0]), []
    for r in range(cand.shape[1]):
        index = scores[rows, r, index].argmax(-1)  # [b]
        path.append(cand[rows, r, index])
    return torch.stack(path, dim=1)


def draft_logits(cfg: DFlash2Config, lm_head, hidden):
    """The LM head's logits for draft rows, with z-lab's output multiplier and softcap."""
    out = lm_logits(lm_head, hidden) * float(cfg.output_multiplier)
    cap = cfg.final_logit_softcapping
    if cap is not None and float(cap) > 0:
        out = torch.tanh(out / float(cap)) * float(cap)
    return out


def draft_lattice(drafter, lm_head, hidden, anchor):
    """(candidates, scores) of a DFlash2 drafter's draft rows `hidden` [b, R, H] after `anchor`
    [b]."""
    logits = draft_logits(drafter.config, lm_head, hidden)
    return drafter.candidate_selector.lattice(hidden, logits, anchor)

"""The DFlash training objective on a `BlockBatch`: drafter forward, decay-weighted CE, acceptance.

The embedding and LM head are the target's, frozen. The LM head runs in bf16 (it is ~90% of the
FLOPs; bf16 matmuls are 3-4x faster on CPUs with AMX/AVX512-BF16) and only on labelled positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .dataset import IGNORE, BlockBatch


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, weighted mean CE
    correct: torch.Tensor  # [B-1] greedy-correct count per block position 1..B-1
    counted: torch.Tensor  # [B-1] positions scored per block position


def decay_weights(block: int, gamma: float) -> torch.Tensor:
    """[B] weight of block position k: exp(-(k-1)/gamma) for k >= 1, 0 for the anchor (k = 0)."""
    k = torch.arange(block, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma) if gamma > 0 else torch.ones(block)
    w[0] = 0.0
    return w


def block_hidden(drafter, embed: torch.nn.Embedding, batch: BlockBatch) -> torch.Tensor:
    """Normed drafter output [b, K*B, H] for every block of the batch (one pass, block mask)."""
    cfg = drafter.config
    ctx = drafter.hidden_norm(drafter.fc(batch.ctx_feats.to(drafter.fc.weight.dtype)))  # [b, C, H]
    x = embed(batch.block_ids).float()  # [b, K*B, H]
    rope_q = drafter.rope(batch.block_pos)  # [b, K*B, D] x2
    rope_kv = drafter.rope(torch.cat([batch.ctx_pos, batch.block_pos], dim=1))  # [b, C + K*B, D] x2
    b, mask = x.shape[0], batch.additive_mask(x.dtype)
    empty = x.new_zeros(b, cfg.num_key_value_heads, 0, cfg.head_dim)
    for layer in drafter.layers:
        x, _, _ = layer(x, rope_q, empty, empty, mask, ctx=ctx, rope_kv=rope_kv)
    return drafter.norm(x)


@dataclass
class DraftHead:
    """The frozen LM head used by the loss: all rows, or the rows of a reduced draft vocabulary.

    With a reduced vocabulary the softmax runs over `vocab` only (the frequent tokens of the
    training responses) and labels outside it are skipped; inference still uses the full head.
    """

    weight: torch.Tensor  # [V', H]
    to_local: torch.Tensor | None = None  # [V] full id -> row of `weight`, -1 if absent

    @classmethod
    def build(
        cls, full_weight: torch.Tensor, dtype, vocab: torch.Tensor | None = None
    ) -> "DraftHead":
        w = full_weight.detach()
        if vocab is None:
            return cls(w.to(dtype))
        to_local = torch.full((w.shape[0],), -1, dtype=torch.long, device=w.device)
        vocab = vocab.to(w.device)
        to_local[vocab] = torch.arange(len(vocab), device=w.device)
        return cls(w[vocab].to(dtype), to_local)

    def local_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return labels if self.to_local is None else self.to_local[labels]


def frequent_tokens(token_lists, size: int, always=()) -> torch.Tensor:
    """The `size` most frequent token ids of `token_lists` (plus `always`, e.g. eos), sorted."""
    counts = torch.bincount(torch.cat(list(token_lists)))
    top = counts.argsort(descending=True)[:size]
    return torch.unique(
        torch.cat([top[counts[top] > 0], torch.tensor(list(always), dtype=torch.long)])
    )


def keep_positions(
    labels: torch.Tensor, block: int, gamma: float, gen: torch.Generator | None
) -> torch.Tensor:
    """Bool [b*K*B]: labelled positions kept for the LM head.

    With a generator, position k is kept with probability exp(-(k-1)/gamma) and the loss is a plain
    mean over kept positions: the same expected gradient as the decay-weighted loss, with the LM
    head (most of the cost: 49k vocabulary) run on ~30% of the positions. Without one, all are kept.
    """
    sel = labels != IGNORE
    if gen is None:
        return sel
    w = decay_weights(block, gamma).repeat(labels.numel() // block)  # [b*K*B]
    return sel & (torch.rand(labels.numel(), generator=gen) < w).to(sel.device)


def dflash_loss(
    drafter,
    embed,
    head: DraftHead,
    batch: BlockBatch,
    gamma: float,
    gen: torch.Generator | None = None,
) -> LossOutput:
    """Decay-weighted CE over block positions (sampled by weight when `gen` is given), plus
    acceptance stats."""
    B = batch.block_size
    hidden = block_hidden(drafter, embed, batch)  # [b, K*B, H]
    labels = batch.labels.reshape(-1)  # [b*K*B]
    local = head.local_labels(labels.clamp(min=0))
    sel = keep_positions(labels, B, gamma, gen) & (local >= 0)  # kept, inside the head
    # [n, V']
    logits = hidden.reshape(-1, hidden.shape[-1])[sel].to(head.weight.dtype) @ head.weight.T
    if batch.soft_ids is None:
        ce = F.cross_entropy(logits.float(), local[sel], reduction="none")  # [n]
    else:
        ce = soft_cross_entropy(
            logits,
            head,
            batch.soft_ids.reshape(-1, batch.soft_ids.shape[-1])[sel],
            batch.soft_p.reshape(-1, batch.soft_p.shape[-1])[sel],
        )
    w = (
        torch.ones_like(ce)
        if gen is not None
        else decay_weights(B, gamma).to(ce.device).repeat(labels.numel() // B)[sel]
    )
    loss = (ce * w).sum() / w.sum().clamp(min=1e-9)
    with torch.no_grad():
        hit = torch.zeros(labels.numel(), device=labels.device)
        hit[sel] = (logits.argmax(-1) == local[sel]).float()
        counted = sel.view(-1, B)[:, 1:].sum(0).cpu()  # [B-1]
        correct = hit.view(-1, B)[:, 1:].sum(0).cpu()
    return LossOutput(loss, correct, counted)


def soft_cross_entropy(
    logits: torch.Tensor, head: DraftHead, ids: torch.Tensor, p: torch.Tensor
) -> torch.Tensor:
    """[n] cross-entropy of the drafter's softmax against the target's top-k distribution (`ids`,
    `p` [n, k]); ids outside a reduced head are dropped and the rest renormalised."""
    local = head.local_labels(ids)
    p = p * (local >= 0)
    p = p / p.sum(-1, keepdim=True).clamp(min=1e-9)
    logq = torch.log_softmax(logits.float(), dim=-1).gather(-1, local.clamp(min=0))  # [n, k]
    return -(p * logq).sum(-1)


def estimated_tau(correct: torch.Tensor, counted: torch.Tensor) -> float:
    """1 + sum_k prod_{j<=k} acc_j from per-position accuracies (assumes independent positions)."""
    acc = correct / counted.clamp(min=1)
    return 1.0 + acc.cumprod(0).sum().item()


def simulated_tau(accept_at, start: int, end: int, budget: int) -> list[int]:
    """Acceptance lengths of greedy speculative decoding replayed on the target's own greedy output.

    `accept_at[a - start]` is the number of leading correct draft tokens for the block anchored at
    position a (teacher forcing is exact here: the committed tokens are the target's greedy ones).
    """
    steps, a, made = [], start, 1  # the prefill commits the first response token
    while a < end and made < budget:
        n = int(accept_at[a - start]) + 1
        steps.append(n)
        a, made = a + n, made + n
    return steps


def lr_at(step: int, total: int, peak: float, warmup: int, progress: float = 0.0) -> float:
    """Linear warmup then cosine decay to 10% of the peak.

    The decay follows the larger of step / total and `progress` (the share of a time budget spent),
    so a run stopped by its time budget still ends at the low learning rate.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(max((step - warmup) / max(total - warmup, 1), progress), 1.0)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

"""Training batches of DFlash blocks: random anchors, block inputs, labels and the block mask.

A sequence `x_0..x_{N-1}` with target features `h_0..h_{N-2}` gives, for an anchor `a` in its
response, the block `[x_a, MASK x (B-1)]` at positions `a..a+B-1`; block position k predicts
`x_{a+k}`. The block sees the context features `h_0..h_{a-1}` (strictly before its anchor, exactly
what the drafter has at inference), itself bidirectionally, and no other block.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from .responses import Sample

IGNORE = -100


@dataclass
class BlockBatch:
    # [b, C, n_ids*H] target features (zero-padded; the samples' dtype, fp16)
    ctx_feats: torch.Tensor
    ctx_pos: torch.Tensor  # [b, C]
    block_ids: torch.Tensor  # [b, K*B] anchor token then mask tokens, per block
    block_pos: torch.Tensor  # [b, K*B]
    # [b, K*B] token at anchor+k, IGNORE at k=0 / past the end / padding blocks
    labels: torch.Tensor
    keep: torch.Tensor  # [b, K*B, C + K*B] bool: which keys each block query sees
    block_size: int
    soft_ids: torch.Tensor | None = (
        None  # [b, K*B, k] the target's top-k for each label (distillation) ...
    )
    soft_p: torch.Tensor | None = (
        None  # [b, K*B, k] ... and their probabilities renormalised over the k
    )

    @property
    def num_blocks(self) -> int:
        return self.block_ids.shape[1] // self.block_size

    def additive_mask(self, dtype=torch.float32) -> torch.Tensor:
        """[b, K*B, C + K*B] additive attention mask (built where the batch lives)."""
        return torch.zeros(self.keep.shape, dtype=dtype, device=self.keep.device).masked_fill(
            ~self.keep, torch.finfo(dtype).min
        )

    def pin_memory(self) -> "BlockBatch":
        """Page-locked copies (DataLoader's pin_memory calls this) for fast, asynchronous GPU
        copies."""
        return replace(
            self,
            **{
                f.name: getattr(self, f.name).pin_memory()
                for f in fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)
            },
        )

    def to(self, device) -> "BlockBatch":
        """The same batch with every tensor on `device` (itself when already there)."""
        if self.block_ids.device == torch.device(device):
            return self
        return replace(
            self,
            **{
                f.name: getattr(self, f.name).to(device, non_blocking=True)
                for f in fields(self)
                if isinstance(getattr(self, f.name), torch.Tensor)
            },
        )


def block_keep(anchors: torch.Tensor, ctx_len: int, block: int, window: int = 0) -> torch.Tensor:
    """Boolean [K*B, C + K*B]: block j sees context columns < anchors[j] and its own B columns.

    With `window` > 0 only the last `window` context columns before each anchor are visible (a
    training curriculum: fewer keys, so the drafter first learns to read the nearby context).
    """
    K = anchors.shape[0]
    col, end = torch.arange(ctx_len)[None], anchors.repeat_interleave(block)[:, None]
    ctx = (col < end) & ((col >= end - window) if window > 0 else True)  # [K*B, C]
    owner = torch.arange(K).repeat_interleave(block)  # [K*B]
    own = owner[:, None] == owner[None, :]  # [K*B, K*B]
    return torch.cat([ctx, own], dim=1)


def anchor_range(sample: Sample) -> tuple[int, int]:
    """Anchors run from the first response token to the second-to-last token (one label at
    least)."""
    return sample.prompt_len, len(sample.tokens) - 1


def sample_anchors(sample: Sample, k: int, gen: torch.Generator) -> torch.Tensor:
    lo, hi = anchor_range(sample)
    if hi <= lo:
        return torch.zeros(0, dtype=torch.long)
    pick = torch.randperm(hi - lo, generator=gen)[:k]
    return (lo + pick).sort().values


def make_batch(
    samples: list[Sample], anchors: list[torch.Tensor], block: int, mask_id: int, window: int = 0
) -> BlockBatch:
    """Stack the blocks of every sample (rows with fewer anchors get inert padding blocks)."""
    b, K = len(samples), max(max(len(a) for a in anchors), 1)
    C = max(len(s.features) for s in samples)
    n_h = samples[0].features.shape[-1]
    feats = torch.zeros(b, C, n_h, dtype=samples[0].features.dtype)
    ids = torch.full((b, K, block), mask_id, dtype=torch.long)
    pos = torch.zeros(b, K, block, dtype=torch.long)
    labels = torch.full((b, K, block), IGNORE, dtype=torch.long)
    keep = torch.zeros(b, K * block, C + K * block, dtype=torch.bool)
    soft = samples[0].soft_ids is not None
    if soft:
        k = samples[0].soft_ids.shape[1]
        soft_ids = torch.zeros(b, K, block, k, dtype=torch.long)
        soft_p = torch.zeros(b, K, block, k)
    offs = torch.arange(block)
    for r, (s, a) in enumerate(zip(samples, anchors)):
        feats[r, : len(s.features)] = s.features
        n = len(a)
        full = torch.cat([a, torch.zeros(K - n, dtype=torch.long)])  # padding blocks: anchor 0
        ids[r, :n, 0] = s.tokens[a]
        pos[r] = full[:, None] + offs  # [K, B]
        tgt = a[:, None] + offs[1:]  # [n, B-1]
        ok = tgt < len(s.tokens)
        labels[r, :n, 1:] = torch.where(ok, s.tokens[tgt.clamp(max=len(s.tokens) - 1)], IGNORE)
        keep[r] = block_keep(full, C, block, window)
        if soft:  # feature row t holds the distribution of token t + 1
            row = (tgt - 1).clamp(max=len(s.soft_ids) - 1)
            soft_ids[r, :n, 1:] = s.soft_ids[row].long()
            soft_p[r, :n, 1:] = torch.softmax(s.soft_logp[row].float(), dim=-1) * ok[..., None]
    extra = (
        {"soft_ids": soft_ids.view(b, K * block, -1), "soft_p": soft_p.view(b, K * block, -1)}
        if soft
        else {}
    )
    return BlockBatch(
        feats,
        torch.arange(C).expand(b, C),
        ids.view(b, -1),
        pos.view(b, -1),  # [b, K*B]
        labels.view(b, -1),
        keep,
        block,
        **extra,
    )


def all_anchor_batch(sample: Sample, block: int, mask_id: int) -> BlockBatch:
    """Every response position as an anchor (for exact greedy acceptance on a held-out sequence)."""
    lo, hi = anchor_range(sample)
    return make_batch([sample], [torch.arange(lo, hi)], block, mask_id)

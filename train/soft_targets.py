"""The target's own next-token distributions (top-k) for distillation, computed from the cached
features.

A hard label says only which token the target chose; its distribution also says which others it
nearly chose, which is more signal per training token, and tokens are what a CPU run lacks. The
features cached with the responses already hold the target's hidden state at the deepest captured
layer `d`, so its logits cost only the layers above `d`, the final norm and the LM head (for
SmolLM2: 2 of 30 layers), not a new forward pass. Only the response positions get a distribution.

Stored per response shard as `soft_{i:05d}_k{K}.pt` next to `shard_{i:05d}.pt` (atomic, resumable):
`ids` [rows, K] int32 and `logp` [rows, K] fp16 (log-softmax over the full vocabulary), one row per
feature row, i.e. per token 0..N-2 of each sample (row t is the distribution of token t + 1; prompt
rows are left zero and never read).

>>> attach_soft_targets(  # doctest: +SKIP
...     target, shard_paths, samples_per_shard, capture=(1, 8, 14, 20, 27), k=16)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..models.layers import causal_mask
from ..models.target import lm_logits
from .responses import Sample


def soft_path(shard: Path, k: int) -> Path:
    return shard.with_name(shard.stem.replace("shard_", "soft_") + f"_k{k}.pt")


@torch.no_grad()
def next_token_logits(target, sample: Sample, capture: tuple[int, ...]) -> torch.Tensor:
    """Target logits [N - 1 - (prompt_len - 1), V] for the response tokens of `sample`, from its
    features.

    Row j predicts token `prompt_len + j`. Runs the target's layers above the deepest captured one
    over the whole sequence (causal), then the final norm and LM head on the response rows only.
    """

    cfg, dev = target.config, target.lm_head.weight.device
    deepest = max(capture)
    H = cfg.hidden_size
    slot = list(capture).index(deepest)
    # [1, T, H]
    x = sample.features[:, slot * H : (slot + 1) * H].to(dev, target.lm_head.weight.dtype)[None]
    T = x.shape[1]
    rope = target.rope(torch.arange(T, device=dev)[None])
    mask = causal_mask(T, 0, dtype=x.dtype).to(dev)
    empty = x.new_zeros(1, cfg.num_key_value_heads, 0, cfg.head_dim)
    for layer in target.model.layers[deepest + 1 :]:
        x, _, _ = layer(x, rope, empty, empty, mask)
    first = sample.prompt_len - 1
    return lm_logits(target.lm_head, target.model.norm(x[0, first:]))  # [T - first, V]


def topk_rows(
    target, sample: Sample, capture: tuple[int, ...], k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int32, logp fp16), each [N - 1, k], for one sample (prompt rows zero)."""
    logp = torch.log_softmax(next_token_logits(target, sample, capture).float(), dim=-1)
    top = logp.topk(k, dim=-1)
    rows = len(sample.features)
    ids = torch.zeros(rows, k, dtype=torch.int32)
    vals = torch.zeros(rows, k, dtype=torch.float16)
    ids[sample.prompt_len - 1 :] = top.indices.to(torch.int32).cpu()
    vals[sample.prompt_len - 1 :] = top.values.half().cpu()
    return ids, vals


def write_soft_shard(
    target, samples: list[Sample], path: Path, capture: tuple[int, ...], k: int
) -> None:
    rows = [topk_rows(target, s, capture, k) for s in samples]
    tmp = path.with_suffix(".tmp")
    torch.save(
        {"ids": torch.cat([r[0] for r in rows]), "logp": torch.cat([r[1] for r in rows]), "k": k},
        tmp,
    )
    os.replace(tmp, path)


def attach_soft_targets(
    target,
    shards: list[Path],
    per_shard: list[list[Sample]],
    capture: tuple[int, ...],
    k: int,
    progress=None,
) -> None:
    """Compute the missing soft-target files of `shards` and set `soft_ids`/`soft_logp` on every
    sample."""
    if k < 1:
        raise ValueError(f"soft targets need k >= 1 (got {k})")
    if max(capture) >= target.config.num_hidden_layers:
        raise ValueError(
            f"captured layer {max(capture)} does not exist in a "
            f"{target.config.num_hidden_layers}-layer target"
        )
    for i, (shard, samples) in enumerate(zip(shards, per_shard)):
        path = soft_path(shard, k)
        if not path.exists():
            write_soft_shard(target, samples, path, capture, k)
        blob = torch.load(path, mmap=True)
        if len(blob["ids"]) != sum(len(s.features) for s in samples):
            raise ValueError(f"{path} does not match {shard} (delete it to recompute)")
        r0 = 0
        for s in samples:
            n = len(s.features)
            s.soft_ids, s.soft_logp = blob["ids"][r0 : r0 + n], blob["logp"][r0 : r0 + n]
            r0 += n
        if progress is not None:
            progress(i + 1, len(shards))

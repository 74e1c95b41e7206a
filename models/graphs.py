"""Torch modules whose forward signature *is* a bundle graph's I/O table (runtime/io_tables.py).

They wrap the reference models' pure `step` functions, adding only the glue a static-shape graph
needs: positions from `start`, the causal mask from shapes, the sequence-major KV layout, fused
argmax."""

from __future__ import annotations

import torch
from torch import nn

from .target import lm_logits


def _split_layers(past: torch.Tensor) -> list[torch.Tensor]:
    """[S, L, Hkv, D] -> L tensors [1, Hkv, S, D]."""
    per_layer = past.permute(1, 2, 0, 3)  # [L, Hkv, S, D]
    return [per_layer[i : i + 1] for i in range(per_layer.shape[0])]


def _stack_layers(new: list[torch.Tensor]) -> torch.Tensor:
    """L tensors [1, Hkv, T, D] -> [T, L, Hkv, D]."""
    return torch.stack([t[0].permute(1, 0, 2) for t in new], dim=1)


class TargetGraph(nn.Module):
    """`target`: T new tokens after S cached ones -> logits, argmax, context features, their K/V."""

    def __init__(self, target, capture: tuple[int, ...]):
        super().__init__()
        self.target = target
        self.capture = tuple(capture)

    def forward(self, input_ids, logits_from, start, past_key, past_value):
        num_new = input_ids.shape[1]
        offsets = torch.arange(num_new, dtype=torch.long)
        positions = start + offsets  # [T]
        key_pos = torch.arange(past_key.shape[0] + num_new, dtype=torch.long)  # [S + T]
        allowed = key_pos[None, :] <= (past_key.shape[0] + offsets)[:, None]  # [T, S + T]
        mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
        logits, hidden, new_k, new_v = self.target.step(
            input_ids,
            positions,
            list(zip(_split_layers(past_key), _split_layers(past_value))),
            mask,
            self.capture,
        )
        logits = logits[:, int(logits_from[0]) :]  # [1, R, V]: the rows from logits_from on
        return logits, logits.argmax(-1), hidden, _stack_layers(new_k), _stack_layers(new_v)


class DrafterGraph(nn.Module):
    """`drafter`: new context features + block ids -> greedy draft tokens and the context's K/V."""

    def __init__(self, target, drafter, vocab=None):
        """`vocab` (sorted token ids, optional): draft only these tokens (a reduced draft
        vocabulary)."""
        super().__init__()
        self.embed = target.model.embed_tokens
        self.lm_head = target.lm_head
        self.drafter = drafter
        self.vocab = vocab
        if vocab is not None:
            self.lm_head = nn.Linear(target.config.hidden_size, len(vocab), bias=False)
            self.lm_head.weight = nn.Parameter(
                target.lm_head.weight.detach()[vocab].clone(), requires_grad=False
            )
            self.register_buffer("vocab_ids", vocab.clone())

    def forward(self, block_ids, ctx_hidden, start, past_key, past_value):
        num_ctx, block = ctx_hidden.shape[1], block_ids.shape[1]
        ctx_positions = start + torch.arange(num_ctx, dtype=torch.long)  # [C]
        block_positions = start + num_ctx + torch.arange(block, dtype=torch.long)  # [B]
        hidden, new_k, new_v = self.drafter.step(
            self.embed(block_ids),
            block_positions,
            ctx_hidden,
            ctx_positions,
            list(zip(_split_layers(past_key), _split_layers(past_value))),
        )
        draft_ids = lm_logits(self.lm_head, hidden[:, 1:]).argmax(-1)  # [1, B-1]
        if self.vocab is not None:
            draft_ids = self.vocab_ids[draft_ids]  # local row -> token id
        return draft_ids, _stack_layers(new_k), _stack_layers(new_v)

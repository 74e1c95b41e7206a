"""The torch reference target: a decoder-only LLM assembled from a family's `AttentionSpec`.

Tensor names follow Hugging Face (`model.layers.{i}.self_attn.q_proj.weight`, ...), so a
checkpoint's `model.safetensors` loads without renaming."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .config import TargetConfig
from .layers import AttentionSpec, DecoderLayer, RMSNorm, RotaryTable, causal_mask
from .moe import SparseMoE
from .static_cache import StaticKVCache


def lm_logits(lm_head: nn.Linear, h: torch.Tensor) -> torch.Tensor:
    """`lm_head(h)` computed on a 2-D view: ONNX export then emits Gemm(transB=1) on the weight
    itself instead of constant-folding a transposed copy, so a tied embedding is stored once per
    graph."""
    return lm_head(h.reshape(-1, h.shape[-1])).view(*h.shape[:-1], -1)  # [..., V]


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [1, T, V]
    # [1, T, len(capture) * H]: outputs of the captured layers, concatenated
    hidden: torch.Tensor | None


class _Body(nn.Module):
    def __init__(self, cfg: TargetConfig, spec: AttentionSpec, mlps: tuple = ()):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        mlps = mlps or (None,) * cfg.num_hidden_layers  # per layer: dense, or router + experts
        self.layers = nn.ModuleList(
            DecoderLayer(spec, cfg.intermediate_size, moe and SparseMoE(moe)) for moe in mlps
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class TargetModel(nn.Module):
    """Forward over a static KV cache; returns logits and the hidden states of requested layers.

    Layer id `i` captures the output of decoder layer `i`, i.e. Hugging Face's `hidden_states[i +
    1]`.

    >>> model = build_target(cfg)                      # doctest: +SKIP
    >>> cache = model.new_cache(max_len=256)           # doctest: +SKIP
    >>> out = model(torch.tensor([[1, 2, 3]]), cache, capture=(1, 4))  # doctest: +SKIP
    """

    def __init__(self, cfg: TargetConfig, spec: AttentionSpec, mlps: tuple = ()):
        """`mlps`: per layer a sparse MLP's spec (spec.MoESpec) or None (dense); () is all dense."""
        super().__init__()
        self.config = cfg
        self.model = _Body(cfg, spec, mlps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        self.rope = RotaryTable(
            cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings
        )

    def tie_weights(self) -> None:
        """A tied checkpoint's LM head *is* its embedding (one tensor, also after loading)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def new_cache(self, max_len: int) -> StaticKVCache:
        return StaticKVCache.for_config(self.config, max_len, self.lm_head.weight.dtype)

    def step(self, input_ids, positions, past, mask, capture=(), last_logits_only=False):
        """Pure forward: (logits, captured hidden or None, new_k list, new_v list).

        `past[i]` is layer i's cached prefix, a (K, V) pair of [1, Hkv, S, D]; `mask` is additive
        [T, S + T]. Nothing is written anywhere: the caller stores the returned K/V. With
        `last_logits_only` the logits are those of the last position only ([b, 1, V]: a batched
        prefill then skips a [b, T, V] tensor).
        """
        x = self.model.embed_tokens(input_ids)  # [1, T, H]
        rope = self.rope(positions)
        new_k, new_v, captured = [], [], []
        for i, layer in enumerate(self.model.layers):
            x, k, v = layer(x, rope, *past[i], mask)
            new_k.append(k)
            new_v.append(v)
            if i in capture:
                captured.append(x)
        hidden = (
            torch.cat([captured[capture.index(i)] for i in capture], dim=-1) if capture else None
        )
        # [b, T or 1, V]
        logits = lm_logits(self.lm_head, self.model.norm(x[:, -1:] if last_logits_only else x))
        return logits, hidden, new_k, new_v

    def forward(
        self, input_ids: torch.Tensor, cache: StaticKVCache, capture: tuple[int, ...] = ()
    ) -> TargetOutput:
        """Run `input_ids` [1, T] after the cached prefix, causally, and append their K/V to
        `cache`."""
        num_new = input_ids.shape[1]
        cache.check_room(num_new)
        start = cache.length
        positions = torch.arange(start, start + num_new)
        past = [cache.past(i) for i in range(self.config.num_hidden_layers)]
        mask = causal_mask(num_new, start, dtype=self.lm_head.weight.dtype)
        logits, hidden, new_k, new_v = self.step(input_ids, positions, past, mask, tuple(capture))
        for i, (k, v) in enumerate(zip(new_k, new_v)):
            cache.write(i, k, v)
        cache.advance(num_new)
        return TargetOutput(logits, hidden)

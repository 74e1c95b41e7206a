"""The torch reference decoding loops: target-only (the oracle) and DFlash speculative.

    prefill -> [draft block -> verify block -> accept prefix + bonus -> roll back caches] -> ...

Every emitted token is the target's own choice at its position (greedy argmax, or the seeded draw of
`runtime.sampling.select_token`), so speculative output equals target-only output token for token.

>>> gen = GenerationConfig(max_new_tokens=64)  # doctest: +SKIP
>>> res = speculative_generate(target, drafter, prompt_ids, gen)  # doctest: +SKIP
>>> res.token_ids, res.mean_acceptance_length  # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..runtime.emitter import Emitter
from ..runtime.errors import ContextOverflowError
from ..runtime.sampling import SamplingParams, select_token
from .dflash2 import draft_lattice, greedy_walk


@dataclass
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: tuple[int, ...] | None = None  # None -> the target config's eos ids
    max_context: int | None = None  # None -> the target's max_position_embeddings
    block_size: int | None = None  # None -> the drafter's trained block size


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated tokens only
    finish_reason: str  # "stop" | "length" | "context"
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens committed per verify step
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return sum(self.acceptance_lengths) / max(len(self.acceptance_lengths), 1)

    @property
    def decode_tokens_per_s(self) -> float:
        return max(len(self.token_ids) - 1, 0) / self.decode_s if self.decode_s else 0.0


def _setup(target, prompt_ids, gen: GenerationConfig, slack: int):
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(1, -1)  # [1, P]
    max_ctx = gen.max_context or target.config.max_position_embeddings
    if prompt.shape[1] == 0:
        raise ValueError("the prompt is empty: pass at least one token")
    if prompt.shape[1] >= max_ctx:
        raise ContextOverflowError(
            f"the prompt has {prompt.shape[1]} tokens but the context holds {max_ctx}; "
            f"shorten the prompt or raise max_context"
        )
    room = max_ctx - prompt.shape[1]
    stop = gen.stop_token_ids if gen.stop_token_ids is not None else target.config.eos_token_id
    emitter = Emitter(gen.max_new_tokens, frozenset(stop), room)
    cache_len = prompt.shape[1] + emitter.budget + slack
    return prompt, emitter, cache_len


@torch.no_grad()
def target_generate(target, prompt_ids, gen: GenerationConfig | None = None) -> GenerationResult:
    """Plain autoregressive decoding with the target alone: the definition of correct output."""
    gen = gen or GenerationConfig()
    prompt, emit, cache_len = _setup(target, prompt_ids, gen, slack=1)
    cache = target.new_cache(cache_len)
    t0 = time.perf_counter()
    logits = target(prompt, cache).logits[0, -1]
    t1 = time.perf_counter()
    emit.push([select_token(logits.numpy(), gen.sampling, cache.length)])
    while not emit.reason:
        logits = target(torch.tensor([[emit.tokens[-1]]]), cache).logits[0, -1]
        emit.push([select_token(logits.numpy(), gen.sampling, cache.length)])
    return GenerationResult(
        emit.tokens, emit.reason, prefill_s=t1 - t0, decode_s=time.perf_counter() - t1
    )


def draft_block(target, drafter, last_token: int, ctx, d_cache, block: int) -> torch.Tensor:
    """`[last_token, d_1 .. d_{B-1}]` [1, B]: one drafter pass over `[last_token, MASK x (B-1)]`."""
    block_ids = torch.full((1, block), drafter.config.mask_token_id, dtype=torch.long)
    block_ids[0, 0] = last_token
    hidden = drafter(target.model.embed_tokens(block_ids), ctx, d_cache)  # [1, B, H]
    if hasattr(drafter, "candidate_selector"):  # DFlash2: the greedy walk over its lattice
        cand, scores = draft_lattice(drafter, target.lm_head, hidden[:, 1:], block_ids[:, 0])
        block_ids[0, 1:] = greedy_walk(cand, scores)[0]
        return block_ids
    block_ids[0, 1:] = target.lm_head(hidden[:, 1:]).argmax(-1)[0]  # greedy draft tokens
    return block_ids


@torch.no_grad()
def speculative_generate(
    target, drafter, prompt_ids, gen: GenerationConfig | None = None
) -> GenerationResult:
    """DFlash speculative decoding; output identical to `target_generate` with the same config."""
    gen = gen or GenerationConfig()
    cfg = drafter.config
    block = gen.block_size or cfg.block_size
    if block < 2:
        raise ValueError(
            f"block_size {block} < 2: a block needs the last token plus at least one mask"
        )
    layer_ids = tuple(cfg.target_layer_ids)
    prompt, emit, cache_len = _setup(target, prompt_ids, gen, slack=block)
    t_cache, d_cache = target.new_cache(cache_len), drafter.new_cache(cache_len)

    t0 = time.perf_counter()
    out = target(prompt, t_cache, capture=layer_ids)
    t1 = time.perf_counter()
    ctx = out.hidden  # [1, P, n_ids*H]
    emit.push([select_token(out.logits[0, -1].numpy(), gen.sampling, t_cache.length)])
    steps: list[int] = []
    while not emit.reason:
        start = t_cache.length  # position of the last token
        block_ids = draft_block(target, drafter, emit.tokens[-1], ctx, d_cache, block)  # [1, B]

        out = target(block_ids, t_cache, capture=layer_ids)  # verify the whole block
        posterior = [
            select_token(out.logits[0, i].numpy(), gen.sampling, start + 1 + i)
            for i in range(block)
        ]
        accepted = 0
        while accepted < block - 1 and block_ids[0, 1 + accepted].item() == posterior[accepted]:
            accepted += 1
        new_tokens = block_ids[0, 1 : 1 + accepted].tolist() + [posterior[accepted]]
        steps.append(len(new_tokens))
        emit.push(new_tokens)

        t_cache.crop(start + accepted + 1)  # keep last token + accepted drafts
        ctx = out.hidden[:, : accepted + 1]  # their features feed the drafter
    return GenerationResult(
        emit.tokens, emit.reason, steps, prefill_s=t1 - t0, decode_s=time.perf_counter() - t1
    )

"""Token selection shared by the torch reference loop and the runtime (numpy only).

Sampling is a pure function of (logits, params, position): the uniform draw for the token placed at
absolute position p comes from a generator seeded with (seed, p). So a target-only run and a
speculative run with the same seed emit *identical* tokens, and speculative verification (accept a
draft token iff it equals the target's own sample at that position) is exactly lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .validate import check


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1.0 disable those filters.

    >>> SamplingParams(temperature=0.7, top_p=0.9, seed=1).greedy
    False
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        for name in ("temperature", "top_k", "top_p", "seed"):  # one rule for every entry point
            check(name, getattr(self, name))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def token_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution a token is drawn from [V] after temperature, top-k and top-p (float64)."""
    z = np.asarray(logits, dtype=np.float64) / params.temperature
    if params.top_k and params.top_k < z.shape[-1]:
        kth = np.partition(z, -params.top_k)[-params.top_k]
        z = np.where(z < kth, -np.inf, z)
    z = z - z.max()
    p = np.exp(z)
    p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]  # mass strictly above each token
        drop = order[before >= params.top_p]  # keep the smallest prefix reaching top_p
        p[drop] = 0.0
        p /= p.sum()
    return p


def select_token(logits: np.ndarray, params: SamplingParams, position: int) -> int:
    """The token placed at absolute `position` (greedy argmax, or a seeded draw)."""
    if params.greedy:
        return int(np.argmax(logits))
    p = token_probs(logits, params)
    u = np.random.default_rng((params.seed, position)).random()
    return int(min(np.searchsorted(np.cumsum(p), u * p.sum(), side="right"), p.shape[0] - 1))

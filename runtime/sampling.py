"""Token selection shared by the torch reference loop and the runtime (numpy only).

Sampling is a pure function of (logits, params, position): the uniforms for the token placed at
absolute position p come from a generator seeded with (seed, p) (`uniform`: stream 0 is the
target's own draw, 1 a sampled drafter walk's, 2 the rejection rule's accept test). A deterministic
draft (a greedy drafter's, prompt lookup's) is kept iff it equals the target's own draw there, so
such a run emits the tokens a target-only run with that seed emits. A draft drawn from a drafter's
distribution q goes through `rejection_token` (speculative sampling): the tokens' distribution is
the target's, but they are not plain sampling's tokens for that seed (runtime/lattice.py).
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


def uniform(seed: int, position: int, stream: int = 0) -> float:
    """Uniform number `stream` of absolute `position` (module docstring: 0 the target's draw, 1 a
    drafter walk's, 2 the accept test), from the generator seeded with (seed, position)."""
    return float(np.random.default_rng((seed, position)).random(stream + 1)[stream])


def draw(p: np.ndarray, u: float) -> int:
    """The token of `p` [V] (weights, not necessarily normalised) at uniform `u` (inverse CDF)."""
    cdf = np.cumsum(p)  # [V]
    return int(min(np.searchsorted(cdf, u * p.sum(), side="right"), p.shape[0] - 1))


def select_token(logits: np.ndarray, params: SamplingParams, position: int) -> int:
    """The token placed at absolute `position` (greedy argmax, or a seeded draw)."""
    if params.greedy:
        return int(np.argmax(logits))
    return draw(token_probs(logits, params), uniform(params.seed, position))


def rejection_token(
    p: np.ndarray, q: np.ndarray, draft: int, params: SamplingParams, position: int
) -> int:
    """The token placed at `position` for a `draft` drawn from q [V]: the draft with probability
    min(1, p(draft) / q(draft)) (uniform stream 2), else a draw from the residual max(0, p - q)
    normalised (stream 0). Whatever q, the token is distributed as the target's p (speculative
    sampling: Leviathan et al. 2023, Chen et al. 2023).

    >>> p, q = np.array([0.5, 0.5, 0.0]), np.array([0.0, 0.2, 0.8])
    >>> rejection_token(p, q, 1, SamplingParams(1.0, seed=0), 7)  # p(1) >= q(1): always kept
    1
    >>> rejection_token(p, q, 2, SamplingParams(1.0, seed=0), 7)  # p(2) = 0: never; the residual
    0
    """
    if uniform(params.seed, position, 2) * q[draft] < p[draft]:  # u < p/q, q(draft) > 0
        return draft
    residual = np.maximum(p - q, 0.0)  # [V]
    if not residual.sum() > 0:  # p == q up to rounding: any draw from p is as good
        residual = p
    return draw(residual, uniform(params.seed, position))

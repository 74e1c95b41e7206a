"""The host walk over a DFlash2 drafter's lattice (models/dflash2.py; graph outputs
`candidate_ids` [B-1, Kc] and `lattice_scores` [B-1, Kc, Kc], io_tables.py), and the rules that
verify its sampled drafts.

Row r's scores[r, m, j] rate candidate j at draft position r after candidate m at position r-1 (the
anchor for r = 0: every m alike). The greedy walk takes, row by row, the best candidate after the
one taken before (z-lab's greedy path; the graph's `draft_ids` is the same walk). The sampled walk
draws row r's candidate from q = softmax(scores[r, m] / temperature) over the Kc candidates (zero
elsewhere), candidates in token-id order, and hands the verifier the q rows it drew from.

Two lossless rules verify a sampled draft (`RULES`; the Generator's `sampled_rule`):

- "rejection" (the default, z-lab's): keep draft d with probability min(1, p(d) / q(d)), else draw
  from the residual max(0, p - q) (sampling.rejection_token). The walk draws with its own uniform.
- "coupling": the walk draws with the *same* uniform as the target's own draw at that position and
  a draft is kept iff it equals that draw. Per position its acceptance is at most the rejection
  rule's (sum_x min(p, q) is the most any coupling of p and q can agree), in general below it.

Measured (docs/BENCHMARKS.md, "Sampled DFlash2 drafts", benchmarks/sampled_acceptance.py; tokens
per verify step, same prompts and seeds, rejection vs coupling): on the random DFlash2 fixture
1.178 / 1.191 / 1.193 vs 1.034 / 1.036 / 1.045 at T 0.3 / 0.7 / 1.0; with the shipped drafter
converted to DFlash2 1.298 vs 1.254 at T 0.7 and 1.252 vs 1.154 at T 1.0, level within noise at
T 0.3 (1.338 vs 1.351, +- 0.018 each). So the rejection rule is the default.

What a seed guarantees under the rejection rule: the tokens are distributed as the target's
(tests/test_sampled_rules.py), and they are not the tokens plain sampling gives with that seed: the
draws are consumed differently (a position's uniform stream 0 is the target's draw, 1 the walk's,
2 the accept test) and a kept token depends on the draft. So the same seed, bundle and settings
give the same tokens where the steps are fixed (`draft="drafter"`); under `draft="auto"` which
steps draft follows the measured step times, and a seed then fixes the distribution, not the
tokens. The coupling gives plain sampling's tokens for the seed whatever the steps
(tests/test_dflash2.py). Deterministic drafts (a greedy drafter's, prompt lookup's) are verified by
the coupling under either rule: for a point-mass q it *is* the rejection rule (kept with
probability p(d), else a draw from p without d), and it keeps plain sampling's tokens.

>>> cand = np.array([[4, 2], [7, 9]]); scores = np.array([[[0, 1], [0, 1]], [[5, 0], [0, 5]]])
>>> greedy_walk(cand, scores).tolist()
[2, 9]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .sampling import SamplingParams, draw, rejection_token, uniform
from .validate import InvalidArgumentError


def coupled_token(p: np.ndarray, draft: int, dist, params: SamplingParams, position: int) -> int:
    """The coupling's token at `position`: the target's own draw (a draft is kept iff it is it)."""
    return draw(p, uniform(params.seed, position))


def rejected_token(p: np.ndarray, draft: int, dist, params: SamplingParams, position: int) -> int:
    """The rejection rule's token at `position` for a draft drawn from `dist` = (candidates [Kc],
    q [Kc]); None (a deterministic draft): the coupling, which is this rule for a point mass."""
    if dist is None:
        return coupled_token(p, draft, dist, params, position)
    cand, q_row = dist
    q = np.zeros_like(p)  # [V]
    np.add.at(q, cand, q_row)
    return rejection_token(p, q, draft, params, position)


@dataclass(frozen=True)
class Rule:
    """How sampled drafts are drawn (`walk_stream`: the sampling.uniform stream) and verified
    (`token`: (p [V], draft, its distribution or None, params, position) -> the token placed)."""

    walk_stream: int
    token: Callable


RULES = {"rejection": Rule(1, rejected_token), "coupling": Rule(0, coupled_token)}
DEFAULT_RULE = "rejection"


def sampled_rule(name: str) -> Rule:
    """RULES[name]; InvalidArgumentError naming the rules otherwise."""
    if name not in RULES:
        raise InvalidArgumentError(
            "sampled_rule", f"sampled_rule={name!r}: expected one of {sorted(RULES)}"
        )
    return RULES[name]


def greedy_walk(cand: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Drafts [R]: row by row the best candidate (first on ties) after the previous one."""
    path, index = np.empty(cand.shape[0], np.int64), 0
    for r in range(cand.shape[0]):
        index = int(np.argmax(scores[r, index]))
        path[r] = cand[r, index]
    return path


def sampled_walk(
    cand: np.ndarray, scores: np.ndarray, params: SamplingParams, first: int, stream: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(drafts [R], the q rows they were drawn from [R, Kc]); row r (absolute position `first` + r)
    draws with uniform `stream` there (module docstring)."""
    rows, top = cand.shape
    path, qs, index = np.empty(rows, np.int64), np.empty((rows, top)), 0
    for r in range(rows):
        z = np.asarray(scores[r, index], np.float64) / params.temperature  # [Kc]
        q = np.exp(z - z.max())
        qs[r] = q / q.sum()
        order = np.argsort(cand[r], kind="stable")  # token-id order, as the target's cumsum
        index = int(order[draw(qs[r][order], uniform(params.seed, first + r, stream))])
        path[r] = cand[r, index]
    return path, qs


def accept_sampled(rule: Rule, probs, drafts, dists, params: SamplingParams, first: int):
    """(drafts accepted, the target's token after them) under `rule`: row i's p [V] is `probs(i)`
    (asked lazily, up to the first miss) for position `first` + i; `dists` = (candidates [R, Kc],
    q [R, Kc]) of sampled drafts, None for deterministic ones."""
    for i, d in enumerate(drafts):
        dist = None if dists is None else (dists[0][i], dists[1][i])
        token = rule.token(probs(i), int(d), dist, params, first + i)
        if token != d:
            return i, token
    n = len(drafts)
    return n, draw(probs(n), uniform(params.seed, first + n))  # all kept: the target's own draw


class LatticeDrafter:
    """A DFlash2 `draft_model.DraftModel` whose drafts are walked here (greedy, or sampled with
    `params` by `rule`); `walked`: the last sampled walk's (candidates, q rows), None if greedy."""

    def __init__(self, model, params: SamplingParams, rule: Rule = RULES[DEFAULT_RULE]):
        self.model, self.params, self.rule = model, params, rule
        self.walked = None

    def draft(self, last_token: int, ctx_end: int) -> np.ndarray:
        self.model.draft(last_token, ctx_end)
        cand, scores = self.model.lattice()
        if self.params.greedy:
            return greedy_walk(cand, scores)
        path, qs = sampled_walk(cand, scores, self.params, ctx_end + 1, self.rule.walk_stream)
        self.walked = (cand, qs)
        return path

    def reset(self) -> None:
        self.model.reset()


def lattice_drafter(model, params: SamplingParams, rule: Rule = RULES[DEFAULT_RULE]):
    """`model` walked here when it is a DFlash2 drafter's (it has a lattice), else `model`."""
    if "candidate_ids" not in getattr(getattr(model, "step", None), "arrays", {}):
        return model
    return LatticeDrafter(model, params, rule)

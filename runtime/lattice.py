"""The host walk over a DFlash2 drafter's lattice (models/dflash2.py; graph outputs
`candidate_ids` [B-1, Kc] and `lattice_scores` [B-1, Kc, Kc], io_tables.py).

Row r's scores[r, m, j] rate candidate j at draft position r after candidate m at position r-1 (the
anchor for r = 0: every m alike). The greedy walk takes, row by row, the best candidate after the
one taken before (z-lab's greedy path; the graph's `draft_ids` is the same walk). The sampled walk
draws row r's candidate from softmax(scores[r, m] / temperature) with the uniform the target's own
draw at that position uses (sampling.select_token: keyed by (seed, position)), over the candidates
in token-id order as the target's draw runs over the vocabulary: where the two distributions are
close the two draws land on the same token, so a sampled draft is accepted as often as the
drafter's distribution allows. Verification is unchanged (a draft is kept iff it equals the target's
own draw), so the output is the target's, token for token, whatever the walk.

>>> cand = np.array([[4, 2], [7, 9]]); scores = np.array([[[0, 1], [0, 1]], [[5, 0], [0, 5]]])
>>> greedy_walk(cand, scores).tolist()
[2, 9]
"""

from __future__ import annotations

import numpy as np

from .sampling import SamplingParams


def greedy_walk(cand: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Drafts [R]: row by row the best candidate (first on ties) after the previous one."""
    path, index = np.empty(cand.shape[0], np.int64), 0
    for r in range(cand.shape[0]):
        index = int(np.argmax(scores[r, index]))
        path[r] = cand[r, index]
    return path


def sampled_walk(
    cand: np.ndarray, scores: np.ndarray, params: SamplingParams, first: int
) -> np.ndarray:
    """Drafts [R] drawn row by row; row r (absolute position `first` + r) with the uniform of the
    target's draw there (module docstring)."""
    path, index = np.empty(cand.shape[0], np.int64), 0
    for r in range(cand.shape[0]):
        z = np.asarray(scores[r, index], np.float64) / params.temperature
        q = np.exp(z - z.max())
        order = np.argsort(cand[r], kind="stable")  # token-id order, as the target's cumsum
        u = np.random.default_rng((params.seed, first + r)).random()
        cdf = np.cumsum(q[order])
        index = int(order[min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(q) - 1)])
        path[r] = cand[r, index]
    return path


class LatticeDrafter:
    """A DFlash2 `draft_model.DraftModel` whose drafts are walked here (greedy, or sampled with
    `params`)."""

    def __init__(self, model, params: SamplingParams):
        self.model, self.params = model, params

    def draft(self, last_token: int, ctx_end: int) -> np.ndarray:
        self.model.draft(last_token, ctx_end)
        cand, scores = self.model.lattice()
        if self.params.greedy:
            return greedy_walk(cand, scores)
        return sampled_walk(cand, scores, self.params, ctx_end + 1)

    def reset(self) -> None:
        self.model.reset()


def lattice_drafter(model, params: SamplingParams):
    """`model` walked here when it is a DFlash2 drafter's (it has a lattice), else `model`."""
    if "candidate_ids" not in getattr(getattr(model, "step", None), "arrays", {}):
        return model
    return LatticeDrafter(model, params)

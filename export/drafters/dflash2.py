"""A DFlash2 drafter (models/dflash2_config.py): dflash2_drafter's graph with its lattice outputs
(candidate_ids, lattice_scores), >= 8-bit conv and selector weights, no reduced vocabulary."""

from __future__ import annotations

import numpy as np

from ...models.dflash2_config import DFlash2Config as Config
from ...runtime.errors import DflashEdgeError
from ..dflash2_drafter import MANIFEST_NOTE as QUANTIZATION_NOTE
from ..dflash2_drafter import build, weight_format

__all__ = ["Config", "QUANTIZATION_NOTE", "build", "weight_format"]


def check_options(opts) -> None:
    """The selector ranks candidates of the whole vocabulary: no --draft-vocab."""
    if opts.draft_vocab:
        raise DflashEdgeError(
            f"--draft-vocab {opts.draft_vocab}: a DFlash2 drafter's selector ranks candidates of "
            f"the whole vocabulary; export it without --draft-vocab"
        )


def manifest_fields(dc) -> dict:
    """Candidates per position of its lattice (runtime/io_tables.py reads it)."""
    return {"draft_selector_top_k": dc.selector_top_k}


def io_dims(dc) -> dict:
    """Kc: the lattice's candidates per position."""
    return {"Kc": dc.selector_top_k}


def reference_graph(dc):
    """The windowed drafter graph module: its outputs carry the lattice."""
    from ...models.drafter import WindowedDrafterGraph

    return WindowedDrafterGraph


def parity_view(names, got: tuple, want: tuple) -> tuple[tuple, tuple]:
    """The lattice as compared: each row's candidates as a sorted set (the order of near-equal
    logits may swap), and the scores of candidate pairs both sides hold (0 elsewhere)."""
    if got[names.index("candidate_ids")] is None:
        return got, want
    c, s = names.index("candidate_ids"), names.index("lattice_scores")
    got, want = list(got), list(want)
    cg, cw = got[c], np.asarray(want[c])  # [1, R, k]
    same = cg == cw  # [1, R, k]: candidate j of row r agrees
    before = np.concatenate([np.ones_like(same[:, :1]), same[:, :-1]], axis=1)  # predecessors
    both = before[..., :, None] & same[..., None, :]  # [1, R, k (m), k (j)]
    got[s], want[s] = np.where(both, got[s], 0), np.where(both, np.asarray(want[s]), 0)
    got[c], want[c] = np.sort(cg, -1), np.sort(cw, -1)
    return tuple(got), tuple(want)

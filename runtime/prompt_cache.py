"""Sequences kept in RAM beside the live one, so alternating conversations or files each resume from
their own prefix (llama-server's `--cache-ram`).

The live sequence is the caches a Generator holds (generator.py `_kept`). When a request would
overwrite most of it, its state is copied here first (`Generator._save`: the target's cache rows,
a hybrid's recurrent state, the drafter's context cache and the target features it has not read
yet); when a kept sequence shares a longer prefix with a request than the live one does, the two
swap. Entries are bounded in bytes, least recently used out first; an entry larger than the whole
budget is dropped, never swapped to disk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def state_bytes(state) -> int:
    """Bytes of the arrays in a nested state (dicts, tuples, lists of arrays and scalars)."""
    if isinstance(state, np.ndarray):
        return state.nbytes
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (tuple, list)):
        return sum(state_bytes(v) for v in state)
    return 0


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two id sequences.

    >>> common_prefix([1, 2, 3], [1, 2, 4, 5]), common_prefix([], [1])
    (2, 0)
    """
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


@dataclass
class KeptSequence:
    """A sequence's ids and the state its caches held after them."""

    ids: list[int]
    state: dict
    nbytes: int


class PromptCache:
    """At most `max_bytes` of kept sequences, most recently used last.

    >>> cache = PromptCache(100)
    >>> cache.put(KeptSequence([1, 2], {}, 60)), cache.put(KeptSequence([3], {}, 60))
    (True, True)
    >>> [e.ids for e in cache.entries], cache.put(KeptSequence([4], {}, 101))
    ([[3]], False)
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.entries: list[KeptSequence] = []

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def best(self, ids: list[int]) -> tuple[int, int]:
        """(index of the entry sharing the longest prefix with `ids`, its length); (-1, 0) when
        none shares any."""
        best = (-1, 0)
        for i, entry in enumerate(self.entries):
            n = common_prefix(entry.ids, ids)
            if n > best[1]:
                best = (i, n)
        return best

    def take(self, index: int) -> KeptSequence:
        """Remove entry `index` and hand it out (it becomes the live sequence)."""
        return self.entries.pop(index)

    def put(self, entry: KeptSequence) -> bool:
        """Keep `entry` as the most recent (entries it extends go: it holds them), dropping the
        least recently used until it fits; False (nothing kept) when it exceeds the whole
        budget."""
        if entry.nbytes > self.max_bytes:
            return False
        n = len(entry.ids)
        self.entries = [
            e for e in self.entries if not (len(e.ids) <= n and entry.ids[: len(e.ids)] == e.ids)
        ]
        while self.entries and self.nbytes + entry.nbytes > self.max_bytes:
            self.entries.pop(0)
        self.entries.append(entry)
        return True

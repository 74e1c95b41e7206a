"""Prompt-lookup proposals: a draft source that costs no model pass.

When the last n tokens of prompt + output occurred earlier, propose the tokens that followed their most
recent earlier occurrence (longest n first). Answers that quote their input (rewrite, fix, convert,
extract) repeat long stretches of the prompt, so these proposals are often right. They are verified by
the same target pass as the drafter's, so the output is still the target's own.

>>> lk = PromptLookup([1, 2, 3, 4, 5, 9, 1, 2, 3])
>>> lk.propose(3)                       # "1 2 3" occurred before, followed by 4 5 9
[4, 5, 9]
>>> lk.extend([7]); lk.propose(3)       # "2 3 7", "3 7", "7" are new: nothing to propose
[]
>>> PromptLookup([4, 4, 4]).propose(3)  # a repeating text continues with its period
[4, 4, 4]
"""
from __future__ import annotations


class PromptLookup:
    """An index of the n-grams of a growing token history: n-gram -> end of its latest earlier occurrence."""

    def __init__(self, history: list[int], max_ngram: int = 4, min_ngram: int = 1):
        self.history: list[int] = []
        self.sizes = tuple(range(max_ngram, min_ngram - 1, -1))       # longest (most specific) first
        self.index: dict[tuple[int, ...], int] = {}
        self.indexed = 0                                               # n-grams ending before this are indexed
        self.matched = 0                                               # n of the last proposal's match (0: none)
        self.extend(history)

    def extend(self, tokens: list[int]) -> None:
        """Append committed tokens; index every n-gram that now has a token after it."""
        self.history += tokens
        h = self.history
        for end in range(max(self.indexed, 1), len(h)):                # end < len(h): a continuation exists
            for n in self.sizes:
                if end >= n:
                    self.index[tuple(h[end - n:end])] = end
        self.indexed = max(self.indexed, len(h))

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the longest matching suffix."""
        h = self.history
        for n in self.sizes:
            if len(h) > n:
                end = self.index.get(tuple(h[-n:]))
                if end is not None:
                    self.matched = n
                    out, period = h[end:end + limit], len(h) - end
                    while len(out) < limit:         # the occurrence runs into the suffix: the text repeats
                        out.append(out[len(out) - period])      # with this period, so continue it
                    return out
        self.matched = 0
        return []
